package e2e

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/namespaces"
	"golang.org/x/sys/unix"
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

// On a kernel older than the oldest supported, noderun refuses to start,
// says why, and creates nothing. setarch --uname-2.6 makes uname report a
// 2.6 release to it.
func TestOldKernelRefused(t *testing.T) {
	t.Parallel()
	requireE2E(t)
	setarch, err := exec.LookPath("setarch")
	if err != nil {
		t.Skip("no setarch (util-linux) to fake an old kernel")
	}
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	state := filepath.Join(dir, "s")
	// Bounded: a noderun that does not refuse keeps running.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, setarch, unix.ByteSliceToString(u.Machine[:]), "--uname-2.6", noderunBin,
		"--manifests", dir, "--state-dir", state, "--run-dir", filepath.Join(dir, "r"),
		"--pod-log-dir", filepath.Join(dir, "l"), "--cni-conf-dir", filepath.Join(dir, "cni"),
		"--containerd-address", ctrdSocket, "--containerd-namespace", "e2e-old-kernel", "--api-port", "0")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() == 0 {
		t.Fatalf("noderun on a faked 2.6 kernel exited with %v, want a non-zero status\n%s", err, out)
	}
	if !strings.Contains(string(out), "Linux 2.6.") || !strings.Contains(string(out), "older than 5.4") {
		t.Errorf("message does not name the kernel and the minimum:\n%s", out)
	}
	if _, err := os.Stat(state); !os.IsNotExist(err) {
		t.Errorf("state dir created before the refusal (%v)", err)
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
