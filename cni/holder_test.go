package cni

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// nsfsMounts counts the namespace pins in the host's mount table.
func nsfsMounts(t *testing.T) int {
	t.Helper()
	return countMounts(t, func(_, fstype string) bool { return fstype == "nsfs" })
}

func hostnameIn(t *testing.T, uts string) string {
	t.Helper()
	return inNamespace(t, uts, unix.CLONE_NEWUTS, func() (string, error) {
		var u unix.Utsname
		err := unix.Uname(&u)
		return string(bytes.TrimRight(u.Nodename[:], "\x00")), err
	})
}

// A pod's ipc and uts namespaces stay off the host's mount table and outlive
// the process that opened the holder, as they must outlive noderun's
// restarts.
func TestHolderKeepsNamespacesAcrossReopen(t *testing.T) {
	requireRoot(t)
	hdir := filepath.Join(t.TempDir(), "ns")
	h := openTestHolder(t, hdir)
	before := nsfsMounts(t)
	pods := t.TempDir()
	var dirs []string
	var ipcs []uint64
	for _, name := range []string{"a", "b", "c"} {
		dir := filepath.Join(pods, name)
		nss, err := CreateNamespaces(dir, "host-"+name, false, h)
		if err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, dir)
		ipcs = append(ipcs, inode(t, nss.IPC))
	}
	if got := nsfsMounts(t) - before; got != len(dirs) {
		t.Errorf("%d namespace pins added to the host's mount table for %d pods, want %d (net only)", got, len(dirs), len(dirs))
	}

	// As noderun restarting: the portal thread ends, a new one comes.
	old := h.Root()
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	h2, err := OpenHolder(hdir)
	if err != nil {
		t.Fatal(err)
	}
	defer h2.Close()
	if h2.Root() == old {
		t.Fatalf("reopened holder has the old portal %s", old)
	}
	ids, err := h2.IDs()
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a", "b", "c"}; !slices.Equal(ids, want) {
		t.Errorf("IDs = %v, want %v", ids, want)
	}
	for i, dir := range dirs {
		nss, err := CreateNamespaces(dir, "ignored", false, h2)
		if err != nil {
			t.Fatal(err)
		}
		if got := inode(t, nss.IPC); got != ipcs[i] {
			t.Errorf("%s: ipc namespace %d after reopen, was %d", dir, got, ipcs[i])
		}
		if got, want := hostnameIn(t, nss.UTS), "host-"+filepath.Base(dir); got != want {
			t.Errorf("%s: hostname %q after reopen, want %q", dir, got, want)
		}
		if err := RemoveNamespaces(dir, h2); err != nil {
			t.Fatal(err)
		}
	}
	if ids, err := h2.IDs(); err != nil || len(ids) != 0 {
		t.Errorf("IDs after removal = %v, %v; want none", ids, err)
	}
	if got := nsfsMounts(t); got != before {
		t.Errorf("%d namespace pins on the host after removal, want %d", got, before)
	}
}

// After a reboot the pin is gone (here: unmounted): a new, empty holder.
func TestHolderAfterReboot(t *testing.T) {
	requireRoot(t)
	hdir := filepath.Join(t.TempDir(), "ns")
	h := openTestHolder(t, hdir)
	dir := filepath.Join(t.TempDir(), "pod")
	nss, err := CreateNamespaces(dir, "web-0", false, h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { RemoveNamespaces(dir, nil) })
	ipc := inode(t, nss.IPC)
	// The kernel reuses a freed namespace's inode number, as soon as the
	// deferred free has run: the test keeps the old one alive, out of the
	// holder's sight, so that an equal number can only mean the same one.
	old, err := os.Open(nss.IPC)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	h.Close()
	if err := unix.Unmount(filepath.Join(hdir, holderPin), unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	h2 := openTestHolder(t, hdir)
	if ids, err := h2.IDs(); err != nil || len(ids) != 0 {
		t.Fatalf("IDs of a new holder = %v, %v; want none", ids, err)
	}
	nss2, err := CreateNamespaces(dir, "web-0", false, h2)
	if err != nil {
		t.Fatal(err)
	}
	if inode(t, nss2.IPC) == ipc {
		t.Error("a new holder gave the pod its old ipc namespace")
	}
	if err := RemoveNamespaces(dir, h2); err != nil {
		t.Fatal(err)
	}
}

// Sandboxes an older noderun made (every pin in the sandbox dir) keep their
// ipc and uts namespaces, which move into the holder.
func TestCreateNamespacesMovesHostPinsIntoHolder(t *testing.T) {
	requireRoot(t)
	h := openTestHolder(t, filepath.Join(t.TempDir(), "ns"))
	dir := filepath.Join(t.TempDir(), "pod")
	old, err := CreateNamespaces(dir, "web-0", false, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { RemoveNamespaces(dir, h) })
	ipc, uts, netns := inode(t, old.IPC), inode(t, old.UTS), inode(t, old.Net)

	nss, err := CreateNamespaces(dir, "ignored", false, h)
	if err != nil {
		t.Fatal(err)
	}
	if nss.IPC == old.IPC || inode(t, nss.IPC) != ipc || inode(t, nss.UTS) != uts || inode(t, nss.Net) != netns {
		t.Errorf("after the move: %+v with inodes %d %d %d, want ipc %d uts %d net %d in the holder",
			nss, inode(t, nss.IPC), inode(t, nss.UTS), inode(t, nss.Net), ipc, uts, netns)
	}
	if got := hostnameIn(t, nss.UTS); got != "web-0" {
		t.Errorf("hostname %q after the move, want web-0", got)
	}
	if n := mountsUnder(t, dir); n != 1 {
		t.Errorf("%d mounts under %s after the move, want 1 (net)", n, dir)
	}
	for _, k := range []string{"ipc", "uts"} {
		if _, err := os.Stat(filepath.Join(dir, k)); err == nil {
			t.Errorf("%s left in %s", k, dir)
		}
	}
}
