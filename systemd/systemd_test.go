package systemd

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// notifySocket stands in for systemd's: it sets NOTIFY_SOCKET to a
// datagram socket the test reads.
func notifySocket(t *testing.T) *net.UnixConn {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	t.Setenv("NOTIFY_SOCKET", sock)
	return conn
}

// receive returns the next notification, or "" when none comes within d.
func receive(t *testing.T, conn *net.UnixConn, d time.Duration) string {
	t.Helper()
	if err := conn.SetReadDeadline(time.Now().Add(d)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 256)
	n, _, err := conn.ReadFromUnix(buf)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(buf[:n])
}

func TestReadySendsToNotifySocket(t *testing.T) {
	conn := notifySocket(t)
	sent, err := Ready()
	if err != nil || !sent {
		t.Fatalf("Ready() = %v, %v; want sent", sent, err)
	}
	if got := receive(t, conn, 5*time.Second); got != "READY=1" {
		t.Fatalf("got %q, want READY=1", got)
	}
}

// The watchdog is fed only while healthy: a stalled noderun gets restarted.
func TestWatchdogOnlyWhileHealthy(t *testing.T) {
	conn := notifySocket(t)
	t.Setenv("WATCHDOG_USEC", "40000") // a ping due every 20 ms
	var sick atomic.Bool
	skipped := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Watchdog(ctx, func() error {
			if sick.Load() {
				return errors.New("sync loop stalled")
			}
			return nil
		}, func(err error) {
			select {
			case skipped <- err:
			default:
			}
		})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	if got := receive(t, conn, 5*time.Second); got != "WATCHDOG=1" {
		t.Fatalf("healthy: got %q, want WATCHDOG=1", got)
	}
	sick.Store(true)
	if err := <-skipped; err == nil || !strings.Contains(err.Error(), "stalled") {
		t.Fatalf("skipped with %v, want the health error", err)
	}
	// Pings sent before the skip; a read with a deadline already passed
	// would not even look.
	for receive(t, conn, 10*time.Millisecond) != "" {
	}
	if got := receive(t, conn, 200*time.Millisecond); got != "" {
		t.Fatalf("unhealthy: got %q, want no ping", got)
	}
	sick.Store(false)
	if got := receive(t, conn, 5*time.Second); got != "WATCHDOG=1" {
		t.Fatalf("healthy again: got %q, want WATCHDOG=1", got)
	}
}

func TestWatchdogOffWithoutWatchdogSec(t *testing.T) {
	notifySocket(t)
	t.Setenv("WATCHDOG_USEC", "")
	os.Unsetenv("WATCHDOG_USEC")
	err := Watchdog(context.Background(), func() error { return nil }, func(error) {})
	if err != nil {
		t.Fatalf("Watchdog without WATCHDOG_USEC: %v, want nil at once", err)
	}
}

func TestExtendStartupUntilDone(t *testing.T) {
	conn := notifySocket(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ExtendStartup(ctx, 10*time.Millisecond, time.Minute) }()
	for range 2 {
		if got := receive(t, conn, 5*time.Second); got != "EXTEND_TIMEOUT_USEC=60000000" {
			t.Fatalf("got %q, want EXTEND_TIMEOUT_USEC=60000000", got)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestReadyOutsideSystemdIsNoop(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	os.Unsetenv("NOTIFY_SOCKET")
	if sent, err := Ready(); sent || err != nil {
		t.Fatalf("Ready() = %v, %v; want not sent, no error", sent, err)
	}
}

func TestUnitKeepsPodsAcrossRestart(t *testing.T) {
	for _, want := range []string{"Type=notify", "KillMode=process", "WatchdogSec=", "ExecStart=/usr/local/bin/noderun"} {
		if !strings.Contains(Unit, want) {
			t.Errorf("unit file lacks %q", want)
		}
	}
}

// Secrets such as a manifest URL's token can come from an optional
// environment file rather than the command line, which ps shows.
func TestUnitReadsOptionalEnvironmentFile(t *testing.T) {
	if !strings.Contains(Unit, "\nEnvironmentFile=-"+EnvFile+"\n") {
		t.Error("unit file lacks an optional EnvironmentFile")
	}
}
