package containerd

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/containerd/containerd/leases"

	"github.com/noderun/noderun/internal/testenv"
)

func namespaceExists(t *testing.T, rt *Runtime) bool {
	t.Helper()
	nss, err := rt.client.NamespaceService().List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return slices.Contains(nss, rt.namespace)
}

func TestResetEmptiesTheNamespace(t *testing.T) {
	rt := testRuntime(t)
	ctx := context.Background()
	cfg := testConfig(t, rt, "reset", "sleep", "600")
	if _, err := rt.StartContainer(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.client.LeasesService().Create(rt.ctx(ctx), leases.WithRandomID(), leases.WithExpiration(time.Hour),
		leases.WithLabels(map[string]string{LabelLease: leaseImport, LabelLeaseOwner: self})); err != nil {
		t.Fatal(err)
	}

	// Without images: containers and leases go, images and the namespace stay.
	if kept, err := rt.Reset(ctx, false); err != nil || kept != nil {
		t.Fatalf("Reset(false) = %v, %v", kept, err)
	}
	if cs, _ := rt.client.Containers(rt.ctx(ctx)); len(cs) != 0 {
		t.Errorf("%d containers left", len(cs))
	}
	if ls, _ := rt.client.LeasesService().List(rt.ctx(ctx)); len(ls) != 0 {
		t.Errorf("%d leases left", len(ls))
	}
	if imgs, _ := rt.client.ImageService().List(rt.ctx(ctx)); len(imgs) == 0 || !namespaceExists(t, rt) {
		t.Fatalf("images (%d) or namespace removed without removeImages", len(imgs))
	}

	// With images: the namespace is empty, so containerd deletes it.
	if kept, err := rt.Reset(ctx, true); err != nil || kept != nil {
		t.Fatalf("Reset(true) = %v, %v", kept, err)
	}
	if namespaceExists(t, rt) {
		t.Fatal("namespace still there")
	}
	// Idempotent.
	if kept, err := rt.Reset(ctx, true); err != nil || kept != nil {
		t.Fatalf("second Reset(true) = %v, %v", kept, err)
	}
}

// managedOnly is the config of a node whose only containerd is the managed
// one: the address names none and no unit is installed.
func managedOnly(t *testing.T) DaemonConfig {
	t.Helper()
	requireDaemonPrereqs(t)
	return DaemonConfig{
		Address: "/nonexistent/containerd.sock", StateDir: t.TempDir(), RunDir: shortTempDir(t),
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
