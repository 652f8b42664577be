package sandbox

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/noderun/noderun/cni"
	"github.com/noderun/noderun/internal/testenv"
	"github.com/noderun/noderun/runner"
)

// A sandbox dir no pod owns (noderun stopped between removing a pod's state
// and its run dir) is removed whole by network GC, with the pod files and
// epoch it holds; the dirs of kept sandboxes are left alone.
func TestNetworkGCRemovesLeftoverSandboxDirs(t *testing.T) {
	root := t.TempDir()
	m, err := cni.New(cni.Config{ConfDir: filepath.Join(root, "conf"), CacheDir: filepath.Join(root, "cache"), BinDirs: []string{filepath.Join(root, "bin")}, NoDefault: true})
	if err != nil {
		t.Fatal(err)
	}
	pods := filepath.Join(root, "pods")
	n := New(m, pods, nil)
	for _, id := range []string{"gone", "kept"} {
		dir := filepath.Join(pods, id)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		for _, f := range append([]string{ipsFile}, runner.SandboxFiles...) {
			if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := n.GC(context.Background(), map[string]bool{"kept": true}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(pods, "gone")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("leftover sandbox dir still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(pods, "kept", "hosts")); err != nil {
		t.Errorf("kept sandbox lost its hosts file: %v", err)
	}
}

// Network GC also removes the held ipc/uts namespaces of sandboxes it no
// longer knows, with or without their sandbox dir.
func TestNetworkGCRemovesLeftoverHeldNamespaces(t *testing.T) {
	testenv.Require(t, os.Geteuid() == 0, "root (to make namespaces)")
	root := t.TempDir()
	m, err := cni.New(cni.Config{ConfDir: filepath.Join(root, "conf"), CacheDir: filepath.Join(root, "cache"), BinDirs: []string{filepath.Join(root, "bin")}, NoDefault: true})
	if err != nil {
		t.Fatal(err)
	}
	hdir := filepath.Join(root, "ns")
	holder, err := cni.OpenHolder(hdir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		holder.Close()
		unix.Unmount(filepath.Join(hdir, "mnt"), unix.MNT_DETACH)
		unix.Unmount(hdir, unix.MNT_DETACH)
	})
	pods := filepath.Join(root, "pods")
	n := New(m, pods, holder)
	for _, id := range []string{"gone", "dirless", "kept"} {
		if _, err := cni.CreateNamespaces(filepath.Join(pods, id), "", true, holder); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { cni.RemoveNamespaces(filepath.Join(pods, "kept"), holder) })
	if err := os.Remove(filepath.Join(pods, "dirless")); err != nil {
		t.Fatal(err)
	}
	if err := n.GC(context.Background(), map[string]bool{"kept": true}); err != nil {
		t.Fatal(err)
	}
	ids, err := holder.IDs()
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 1 || ids[0] != "kept" {
		t.Errorf("held namespaces after GC: %v, want [kept]", ids)
	}
	sb := runner.Sandbox{Dir: filepath.Join(pods, "kept"), NSHolder: holder.Root()}
	if !isNamespace(sb.IPCNSPath()) {
		t.Errorf("kept sandbox lost its ipc namespace %s", sb.IPCNSPath())
	}
}
