package containerd

import (
	"context"
	"go/version"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	ctrd "github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/oci"
	"github.com/containerd/containerd/plugin"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/noderun/noderun/internal/testenv"
	"github.com/noderun/noderun/runner"
	"github.com/noderun/noderun/runner/containerd/daemon"
)

// plantShim starts a runc v2 shim for namespace ns and containerd address
// as containerd does, in a bundle that is then deleted: what a task delete
// cut short leaves. It returns the shim's pid, killed at cleanup.
func plantShim(t *testing.T, address, ns, id string) int {
	t.Helper()
	return plantShimIn(t, t.TempDir(), address, ns, id, true)
}

// plantShimIn starts the shim in bundle, and deletes it with deleteBundle.
func plantShimIn(t *testing.T, bundle, address, ns, id string, deleteBundle bool) int {
	t.Helper()
	pid, socket := testenv.PlantShim(t, bundle, address, ns, id)
	if socket != shimSocket(address, ns, id) {
		t.Fatalf("shim listens on %s, shimSocket says %s", socket, shimSocket(address, ns, id))
	}
	if found := shimListeningOn(t, address, ns, socket); found != pid {
		t.Fatalf("findShims says pid %d listens on %s, the shim says it is %d", found, socket, pid)
	}
	if deleteBundle {
		if err := os.RemoveAll(bundle); err != nil {
			t.Fatal(err)
		}
	}
	return pid
}

// shimListeningOn is the pid of the shim of containerd address and
// namespace ns listening on socket.
func shimListeningOn(t *testing.T, address, ns, socket string) int {
	t.Helper()
	shims, err := findShims(canonicalAddress(address), ns)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range shims {
		if slices.Contains(s.sockets, socket) {
			return s.pid
		}
	}
	t.Fatalf("no shim of %s in %s listens on %s: %+v", address, ns, socket, shims)
	return 0
}

// shimOf is the pid of the shim running the container's task.
func shimOf(t *testing.T, d *daemon.Process, id string) int {
	t.Helper()
	return shimListeningOn(t, d.Address(), testNamespace, shimSocket(d.Address(), testNamespace, id))
}

// Only the shim of this daemon and namespace that serves no task and whose
// bundle is deleted is killed: the shims of a running and of an exited
// task, one whose bundle is still there (its task being created), and a
// stray one of another daemon or namespace, are left.
func TestReapStrayShims(t *testing.T) {
	rt, d := testRuntimeDaemon(t)
	live := testConfig(t, rt, "live", "sleep", "1000")
	startContainer(t, rt, live)
	exited := testConfig(t, rt, "exited", "true")
	startContainer(t, rt, exited)
	waitExited(t, rt, exited)
	liveShim, exitedShim := shimOf(t, d, live.ID), shimOf(t, d, exited.ID)

	stray := plantShim(t, d.Address(), testNamespace, "stray")
	otherDaemon := plantShim(t, filepath.Join(testenv.ShortTempDir(t), "other.sock"), testNamespace, "stray")
	otherNamespace := plantShim(t, d.Address(), "other-namespace", "stray")
	creating := plantShimIn(t, t.TempDir(), d.Address(), testNamespace, "creating", false)

	// Through a symlink and with the scheme, as a recorded address may be.
	link := filepath.Join(testenv.ShortTempDir(t), "link.sock")
	if err := os.Symlink(d.Address(), link); err != nil {
		t.Fatal(err)
	}
	n, err := ReapStrayShims(context.Background(), rt.client, "unix://"+link, testNamespace, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Errorf("killed %d shims, want 1", n)
	}
	deadline := time.Now().Add(10 * time.Second)
	for alive(stray) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if alive(stray) {
		t.Error("the stray shim still runs")
	}
	if _, err := os.Stat(shimSocket(d.Address(), testNamespace, "stray")); !os.IsNotExist(err) {
		t.Errorf("the stray shim's socket is left: %v", err)
	}
	for name, pid := range map[string]int{"running task's": liveShim, "exited task's": exitedShim,
		"other daemon's": otherDaemon, "other namespace's": otherNamespace, "bundled": creating} {
		if !alive(pid) {
			t.Errorf("the %s shim was killed", name)
		}
	}
	if st := containerStatus(t, rt, live); st.State != runner.StateRunning {
		t.Errorf("live container in state %v after the reaping", st.State)
	}
	if st := containerStatus(t, rt, exited); st.State != runner.StateExited {
		t.Errorf("exited container in state %v after the reaping", st.State)
	}
}

// The shim's Go version is read; a binary of this Go does not signal by
// PID, one older than go9.0 does.
func TestShimSignalsByPID(t *testing.T) {
	path, goVersion, byPID := shimSignalsByPID()
	testenv.Require(t, path != "", shimBinary+" on PATH")
	if !version.IsValid(goVersion) {
		t.Fatalf("%s: Go version %q read", path, goVersion)
	}
	t.Logf("%s built with %s: signals by PID %t", path, goVersion, byPID)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if v, old := builtBefore(self, "go1.23"); v != runtime.Version() || old {
		t.Errorf("this test binary: %s, older than go1.23 %t; want %s, false", v, old, runtime.Version())
	}
	if v, old := builtBefore(self, "go9.0"); !old {
		t.Errorf("this test binary (%s) not older than go9.0", v)
	}
}

// A removal whose caller gave up (the pod removed while its worker was
// deleting a task) still deletes task, shim and container: cut short, it
// could leave a shim serving nothing, which nothing later finds.
func TestRemoveContainerCompletesAfterItsContextEnds(t *testing.T) {
	rt, d := testRuntimeDaemon(t)
	cfg := testConfig(t, rt, "removed", "sleep", "1000")
	testenv.SkipIfEmulated(t, shimRunsTestBinary)
	if _, err := rt.StartContainer(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	shim, err := os.FindProcess(shimOf(t, d, cfg.ID))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := rt.RemoveContainer(ctx, cfg.ID); err != nil {
		t.Fatalf("RemoveContainer with its context ended: %v", err)
	}
	if sts, err := rt.ListContainers(context.Background(), string(cfg.Pod.UID)); err != nil || len(sts) != 0 {
		t.Errorf("after the removal: %+v, %v; want no container", sts, err)
	}
	if !exitsWithin(shim, 10*time.Second) {
		t.Error("the task's shim still runs")
	}
}

// A container whose task containerd lost while the task's shim lives on
// (a delete cut short by a kill -9: the shim deleted the task, containerd
// dropped it, the shutdown never came) has that shim shut down by its
// removal; ReapStrayShims spares it, its bundle being still there.
func TestRemoveContainerShutsDownAnOrphanedShim(t *testing.T) {
	rt, d := testRuntimeDaemon(t)
	ctx := namespaces.WithNamespace(context.Background(), testNamespace)
	const id = "orphaned"
	if _, err := rt.client.NewContainer(ctx, id, ctrd.WithRuntime(plugin.RuntimeRuncV2, nil),
		ctrd.WithSpec(&oci.Spec{Version: specs.Version})); err != nil {
		t.Fatal(err)
	}
	shim, err := os.FindProcess(plantShimIn(t, t.TempDir(), d.Address(), testNamespace, id, false))
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.RemoveContainer(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	if !exitsWithin(shim, 10*time.Second) {
		t.Error("the orphaned shim still runs after its container's removal")
	}
}
