package containerd

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	ctrd "github.com/containerd/containerd"

	"github.com/noderun/noderun/internal/testenv"
	"github.com/noderun/noderun/runner/containerd/daemon"
)

const testNamespace = "noderun-test"

var prerequisite = testenv.Require

// startTestDaemon starts a private containerd that is stopped at cleanup.
func startTestDaemon(t *testing.T) *daemon.Process {
	t.Helper()
	testenv.RequireContainerd(t)
	root := t.TempDir()
	d, err := daemon.Start(context.Background(), filepath.Join(root, "root"), filepath.Join(root, "state"),
		filepath.Join(testenv.ShortTempDir(t), "c.sock"), filepath.Join(root, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return d
}

// testClient returns a client of a fresh private containerd.
func testClient(t *testing.T) *ctrd.Client {
	t.Helper()
	return clientOf(t, startTestDaemon(t))
}

// clientOf returns a client of d in the test namespace, closed with the test.
func clientOf(t *testing.T, d *daemon.Process) *ctrd.Client {
	t.Helper()
	c, err := ctrd.New(d.Address(), ctrd.WithDefaultNamespace(testNamespace))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, nil))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

// exitsWithin reports whether p is gone within d.
func exitsWithin(p *os.Process, d time.Duration) bool {
	for deadline := time.Now().Add(d); p.Signal(syscall.Signal(0)) == nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}
