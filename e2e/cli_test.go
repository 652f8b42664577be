package e2e

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/containerd/containerd/namespaces"
	v1 "k8s.io/api/core/v1"
)

// `noderun images import` puts a tarball's images into noderun's namespace.
func TestImagesImportCommand(t *testing.T) {
	t.Parallel()
	requireE2E(t)
	ns := "e2e-import"
	out, err := exec.Command(noderunBin, "--containerd-address", ctrdSocket, "--containerd-namespace", ns,
		"images", "import", imageTar).CombinedOutput()
	if err != nil {
		t.Fatalf("images import: %v\n%s", err, out)
	}
	ctx := namespaces.WithNamespace(context.Background(), ns)
	t.Cleanup(func() {
		for _, name := range imageNames {
			_ = client.ImageService().Delete(ctx, name)
		}
	})
	for _, name := range imageNames {
		if !strings.Contains(string(out), name) {
			t.Errorf("output does not name %s:\n%s", name, out)
		}
		img, err := client.GetImage(ctx, name)
		if err != nil {
			t.Fatalf("%s not in namespace %s: %v", name, ns, err)
		}
		if ok, err := img.IsUnpacked(ctx, "overlayfs"); err != nil || !ok {
			t.Errorf("%s not unpacked (%v)", name, err)
		}
	}
}

// Without a containerd to talk to or start, noderun exits and says what to do.
func TestNoContainerdIsAClearError(t *testing.T) {
	t.Parallel()
	requireE2E(t)
	dir := t.TempDir()
	cmd := exec.Command(noderunBin, "--manifests", dir, "--state-dir", filepath.Join(dir, "s"),
		"--run-dir", filepath.Join(dir, "r"), "--pod-log-dir", filepath.Join(dir, "l"),
		"--containerd-address", filepath.Join(dir, "none.sock"), "--api-port", "0")
	cmd.Env = []string{"PATH=" + dir} // no containerd binary to start
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() == 0 {
		t.Fatalf("noderun exited with %v, want a non-zero status\n%s", err, out)
	}
	for _, want := range []string{"apt-get install containerd", "--containerd-address"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("message lacks %q:\n%s", want, out)
		}
	}
}

// newManagedNode starts a node on a managed containerd of its own (asked
// for: this machine may have a containerd service, which noderun would
// otherwise wait for) and returns the daemon's PID; cleanup stops it.
func newManagedNode(t *testing.T) (*node, int) {
	t.Helper()
	requireE2E(t)
	var n *node
	// Registered first so it runs last, after the node has torn pods down.
	t.Cleanup(func() {
		if n != nil {
			stopManaged(t, n.run)
		}
	})
	n = newNode(t, "--containerd-address", "/nonexistent/containerd.sock", "--containerd-managed")
	pid := managedPID(n)
	if pid <= 0 {
		t.Fatal("no managed containerd runs for the node")
	}
	return n, pid
}

// A managed containerd outlives noderun; a restarted noderun reuses it,
// and the pods in it.
func TestManagedContainerdReusedAfterCrash(t *testing.T) {
	t.Parallel()
	n, pid := newManagedNode(t)
	n.writeManifest("p.yaml", sleeperPod("managed", "busybox:1.36", "managed"))
	before := n.waitPod("managed", "Running", running)

	n.kill9()
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("managed containerd died with noderun: %v", err)
	}
	n.start()
	if again := managedPID(n); again != pid {
		t.Fatalf("managed containerd pid %d after restart, want the same %d", again, pid)
	}
	after := n.waitPod("managed", "Running after restart", running)
	if after.Status.ContainerStatuses[0].ContainerID != before.Status.ContainerStatuses[0].ContainerID ||
		after.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Fatalf("container %s (restarts %d) after restart, want %s untouched",
			after.Status.ContainerStatuses[0].ContainerID, after.Status.ContainerStatuses[0].RestartCount,
			before.Status.ContainerStatuses[0].ContainerID)
	}
	n.removeManifest("p.yaml")
	n.waitGone("managed", waitTimeout)
	var list v1.PodList
	if err := n.get("/pods", &list); err != nil || len(list.Items) != 0 {
		t.Fatalf("pods after removal: %v %v", list.Items, err)
	}
}

// managedPID finds the node's managed containerd by its config path.
func managedPID(n *node) int { return managedPIDIn(n.run) }
