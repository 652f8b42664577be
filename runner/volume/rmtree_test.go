package volume

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/noderun/noderun/internal/testenv"
	"golang.org/x/sys/unix"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount")
	}
}

// bind binds src on target (made first) and unmounts it at cleanup.
func bind(t *testing.T, src, target string) {
	t.Helper()
	if err := os.MkdirAll(target, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(target, unix.MNT_DETACH) })
}

// A bind of a directory of the same file system shares its device: only
// the mount ID tells removal that it would leave the tree.
func TestRemoveOnMountStopsAtMounts(t *testing.T) {
	requireRoot(t)
	for _, kind := range []string{"bind", "tmpfs"} {
		t.Run(kind, func(t *testing.T) {
			dir := t.TempDir()
			host := filepath.Join(dir, "host")
			testenv.WriteFile(t, filepath.Join(host, "precious"), "data")
			tree := filepath.Join(dir, "pod")
			testenv.WriteFile(t, filepath.Join(tree, "a", "b", "own"), "data")
			mnt := filepath.Join(tree, "a", "vol")
			if kind == "bind" {
				bind(t, host, mnt)
			} else {
				if err := os.MkdirAll(mnt, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, ""); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) })
				testenv.WriteFile(t, filepath.Join(mnt, "precious"), "data")
			}
			err := RemoveOnMount(tree)
			if !errors.Is(err, ErrMountPoint) {
				t.Fatalf("removing across a %s: %v, want %v", kind, err, ErrMountPoint)
			}
			if _, err := os.Stat(filepath.Join(mnt, "precious")); err != nil {
				t.Errorf("what the %s shows was reached: %v", kind, err)
			}
			if _, err := os.Stat(filepath.Join(tree, "a", "b")); !os.IsNotExist(err) {
				t.Errorf("the rest of the tree: %v, want removed", err)
			}
		})
	}
}

// Links are removed, never followed, and a missing tree is no error.
func TestRemoveOnMountRemovesLinks(t *testing.T) {
	dir := t.TempDir()
	host := filepath.Join(dir, "host")
	testenv.WriteFile(t, filepath.Join(host, "precious"), "data")
	tree := filepath.Join(dir, "pod")
	testenv.WriteFile(t, filepath.Join(tree, "own"), "data")
	if err := os.Symlink(host, filepath.Join(tree, "link")); err != nil {
		t.Fatal(err)
	}
	if err := RemoveOnMount(tree); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tree); !os.IsNotExist(err) {
		t.Errorf("tree: %v, want removed", err)
	}
	if _, err := os.Stat(filepath.Join(host, "precious")); err != nil {
		t.Errorf("the link's target was reached: %v", err)
	}
	if err := RemoveOnMount(tree); err != nil {
		t.Errorf("again: %v", err)
	}
}

// RemoveTree given a path through a link finds the mounts below it (the
// mount table names them by their resolved path), unmounts them, and
// removes the tree; a tree that is itself a link goes, not its target.
func TestRemoveTreeThroughLink(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	host := filepath.Join(dir, "host")
	testenv.WriteFile(t, filepath.Join(host, "precious"), "data")
	real := filepath.Join(dir, "disk", "run")
	bind(t, host, filepath.Join(real, "pods", "sb", "vol"))
	link := filepath.Join(dir, "run")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	if err := RemoveTree(filepath.Join(link, "pods")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(real, "pods")); !os.IsNotExist(err) {
		t.Errorf("tree: %v, want removed", err)
	}
	if _, err := os.Stat(filepath.Join(host, "precious")); err != nil {
		t.Errorf("the host path bound below was reached: %v", err)
	}
	if err := os.Symlink(host, filepath.Join(real, "pods")); err != nil {
		t.Fatal(err)
	}
	if err := RemoveTree(filepath.Join(real, "pods")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(real, "pods")); !os.IsNotExist(err) {
		t.Errorf("link: %v, want removed", err)
	}
	if _, err := os.Stat(filepath.Join(host, "precious")); err != nil {
		t.Errorf("the link's target was reached: %v", err)
	}
}

// Kernels before 5.8 (and qemu-user) give no STATX_MNT_ID: the fdinfo
// fallback must tell a bind of the same file system apart just as well.
func TestFdinfoMountIDTellsABindApart(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	host, mnt := filepath.Join(dir, "host"), filepath.Join(dir, "mnt")
	if err := os.MkdirAll(host, 0o755); err != nil {
		t.Fatal(err)
	}
	bind(t, host, mnt)
	ids := map[string]uint64{}
	for _, p := range []string{dir, host, mnt} {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		id, err := fdinfoMountID(int(f.Fd()))
		if err != nil {
			t.Fatal(err)
		}
		ids[p] = id
		var st unix.Statx_t
		if err := unix.Statx(int(f.Fd()), "", unix.AT_EMPTY_PATH, unix.STATX_MNT_ID, &st); err == nil && st.Mask&unix.STATX_MNT_ID != 0 && st.Mnt_id != 0 && st.Mnt_id != id {
			t.Errorf("%s: fdinfo mount ID %d, statx %d", p, id, st.Mnt_id)
		}
	}
	if ids[dir] != ids[host] {
		t.Errorf("a plain directory: mount ID %d, its parent's %d", ids[host], ids[dir])
	}
	if ids[mnt] == ids[dir] {
		t.Errorf("a bind: mount ID %d, the same as its parent's", ids[mnt])
	}
}

// RemoveFilesIn removes the selected entries as os.Remove does, links as
// links, and refuses a dir reached through a link or on another mount.
func TestRemoveFilesInFollowsNoLinks(t *testing.T) {
	root, host := t.TempDir(), t.TempDir()
	testenv.WriteFile(t, filepath.Join(host, "old"), "data")
	dir := filepath.Join(root, "pod", "c")
	testenv.WriteFile(t, filepath.Join(dir, "old"), "data")
	testenv.WriteFile(t, filepath.Join(dir, "keep"), "data")
	if err := os.Symlink(filepath.Join(host, "old"), filepath.Join(dir, "old-link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(host, filepath.Join(root, "pod", "link")); err != nil {
		t.Fatal(err)
	}
	old := func(n string) bool { return strings.HasPrefix(n, "old") }
	if err := RemoveFilesIn(root, dir, old); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 || ents[0].Name() != "keep" {
		t.Errorf("left %v, want keep alone", ents)
	}
	for _, d := range []string{filepath.Join(root, "pod", "link"), host, filepath.Join(root, "pod", "link", "x")} {
		if err := RemoveFilesIn(root, d, old); err == nil {
			t.Errorf("%s: removed through a link or outside root", d)
		}
	}
	if os.Geteuid() == 0 {
		mnt := filepath.Join(root, "pod", "mnt")
		bind(t, host, mnt)
		if err := RemoveFilesIn(root, mnt, old); !errors.Is(err, ErrMountPoint) {
			t.Errorf("across a bind: %v, want %v", err, ErrMountPoint)
		}
	}
	if _, err := os.Stat(filepath.Join(host, "old")); err != nil {
		t.Errorf("the host's file was reached: %v", err)
	}
}
