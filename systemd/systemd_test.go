package systemd

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadySendsToNotifySocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	t.Setenv("NOTIFY_SOCKET", sock)
	sent, err := Ready()
	if err != nil || !sent {
		t.Fatalf("Ready() = %v, %v; want sent", sent, err)
	}
	buf := make([]byte, 64)
	n, _, err := conn.ReadFromUnix(buf)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(buf[:n]); got != "READY=1" {
		t.Fatalf("got %q, want READY=1", got)
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
	for _, want := range []string{"Type=notify", "KillMode=process", "ExecStart=/usr/local/bin/noderun"} {
		if !strings.Contains(Unit, want) {
			t.Errorf("unit file lacks %q", want)
		}
	}
}

// Secrets such as a manifest URL's token can come from an optional
// environment file rather than the command line, which ps shows.
func TestUnitReadsOptionalEnvironmentFile(t *testing.T) {
	if !strings.Contains(Unit, "\nEnvironmentFile=-/etc/noderun/env\n") {
		t.Error("unit file lacks an optional EnvironmentFile")
	}
}
