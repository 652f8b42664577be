package daemon

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/noderun/noderun/internal/testenv"
)

// managedOnly is the config of a node whose only containerd is the managed
// one: the address names none and no unit is installed.
func managedOnly(t *testing.T) Config {
	t.Helper()
	testenv.RequireContainerd(t)
	return Config{
		Address: "/nonexistent/containerd.sock", StateDir: t.TempDir(), RunDir: testenv.ShortTempDir(t),
		Namespace: testNamespace, Logger: testLogger(t), Root: t.TempDir(),
	}
}

func TestStopManagedStopsTheDaemonAndRemovesItsDirs(t *testing.T) {
	cfg := managedOnly(t)
	ctx := context.Background()
	if c, err := ConnectForReset(ctx, cfg); c != nil || err != nil {
		t.Fatalf("ConnectForReset without a record = %v, %v; want nothing", c, err)
	}
	first, err := Connect(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	first.Client.Close()
	pid := mustSocketPID(t, cfg.managedSocket())
	stopAtCleanup(t, pid)

	conn, err := ConnectForReset(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !conn.Managed || conn.proc.Pid != pid {
		t.Fatalf("ConnectForReset: managed=%v pid=%d, want the running managed daemon %d", conn.Managed, conn.proc.Pid, pid)
	}
	if err := conn.StopManaged(ctx); err != nil {
		t.Fatal(err)
	}
	if alive(pid) {
		t.Fatal("managed containerd still running")
	}
	for _, dir := range []string{filepath.Join(cfg.StateDir, "containerd"), filepath.Join(cfg.RunDir, "containerd")} {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("%s: %v, want removed", dir, err)
		}
	}
}

// StopManaged after the daemon died and another process got its pid: that
// process gets no signal.
func TestStopManagedSparesTheNextOwnerOfThePID(t *testing.T) {
	ctx := context.Background()
	testenv.ReusePID(t, func() bool {
		cfg := managedOnly(t)
		first, err := Connect(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		first.Client.Close()
		conn, err := ConnectForReset(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		pid := conn.proc.Pid
		other, ok := testenv.KillAndTakePID(t, pid)
		if !ok {
			return false
		}
		stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := conn.StopManaged(stopCtx); err != nil {
			t.Fatal(err)
		}
		if !testenv.EndedByKill(t, other) {
			t.Fatal("StopManaged signalled the process given the pid of the daemon after it died")
		}
		return true
	})
}
