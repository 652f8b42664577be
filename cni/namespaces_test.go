package cni

import (
	"bytes"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestCreateNamespaces(t *testing.T) {
	requireRoot(t)
	dir := filepath.Join(t.TempDir(), "pod")
	nss, err := CreateNamespaces(dir, "web-0", false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { RemoveNamespaces(dir) })

	want := Namespaces{Net: dir + "/net", IPC: dir + "/ipc", UTS: dir + "/uts"}
	if nss != want {
		t.Fatalf("got %+v, want %+v", nss, want)
	}
	for _, k := range []struct{ name, path string }{{"net", nss.Net}, {"ipc", nss.IPC}, {"uts", nss.UTS}} {
		if host, pod := inode(t, "/proc/self/ns/"+k.name), inode(t, k.path); host == pod {
			t.Errorf("%s namespace is the host's (inode %d)", k.name, host)
		}
	}

	hostname := inNamespace(t, nss.UTS, unix.CLONE_NEWUTS, func() (string, error) {
		var u unix.Utsname
		err := unix.Uname(&u)
		return string(bytes.TrimRight(u.Nodename[:], "\x00")), err
	})
	if hostname != "web-0" {
		t.Errorf("hostname in pod = %q, want web-0", hostname)
	}

	loUp := inNamespace(t, nss.Net, unix.CLONE_NEWNET, func() (bool, error) {
		lo, err := net.InterfaceByName("lo")
		if err != nil {
			return false, err
		}
		return lo.Flags&net.FlagUp != 0, nil
	})
	if !loUp {
		t.Error("lo is down in the pod's netns")
	}

	// A repeat (e.g. after a crash) keeps the namespaces already pinned.
	before := inode(t, nss.Net)
	again, err := CreateNamespaces(dir, "web-0", false)
	if err != nil {
		t.Fatal(err)
	}
	if again != nss || inode(t, again.Net) != before {
		t.Errorf("repeat gave %+v (net inode %d), want %+v (net inode %d)", again, inode(t, again.Net), nss, before)
	}
	if n := mountsUnder(t, dir); n != 3 {
		t.Errorf("%d mounts under %s after repeat, want 3", n, dir)
	}

	// A second pod gets namespaces of its own.
	dir2 := filepath.Join(t.TempDir(), "pod2")
	nss2, err := CreateNamespaces(dir2, "web-1", false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { RemoveNamespaces(dir2) })
	if inode(t, nss2.Net) == inode(t, nss.Net) {
		t.Error("two pods share a netns")
	}
}

func TestCreateNamespacesHostNetwork(t *testing.T) {
	requireRoot(t)
	dir := filepath.Join(t.TempDir(), "pod")
	nss, err := CreateNamespaces(dir, "ignored", true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { RemoveNamespaces(dir) })
	if want := (Namespaces{IPC: dir + "/ipc"}); nss != want {
		t.Fatalf("got %+v, want %+v", nss, want)
	}
	if inode(t, nss.IPC) == inode(t, "/proc/self/ns/ipc") {
		t.Error("ipc namespace is the host's")
	}
	for _, k := range []string{"net", "uts"} {
		if _, err := os.Stat(filepath.Join(dir, k)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s pinned for a hostNetwork pod (stat: %v)", k, err)
		}
	}
}

func TestCreateNamespacesRepairsPartial(t *testing.T) {
	requireRoot(t)
	dir := filepath.Join(t.TempDir(), "pod")
	nss, err := CreateNamespaces(dir, "web-0", false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { RemoveNamespaces(dir) })
	ipc := inode(t, nss.IPC)
	// As after a crash between pins: uts never mounted, a bare file left.
	if err := unpin(nss.UTS); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(nss.UTS, nil, 0o444); err != nil {
		t.Fatal(err)
	}

	if _, err := CreateNamespaces(dir, "web-0", false); err != nil {
		t.Fatal(err)
	}
	if inode(t, nss.IPC) != ipc {
		t.Error("repair replaced the ipc namespace that was still pinned")
	}
	if live, err := isNamespace(nss.UTS); err != nil || !live {
		t.Errorf("uts not pinned after repair (live=%v, err=%v)", live, err)
	}
}

func TestRemoveNamespaces(t *testing.T) {
	requireRoot(t)
	dir := filepath.Join(t.TempDir(), "pod")
	if _, err := CreateNamespaces(dir, "web-0", false); err != nil {
		t.Fatal(err)
	}
	if err := RemoveNamespaces(dir); err != nil {
		t.Fatal(err)
	}
	if n := mountsUnder(t, dir); n != 0 {
		t.Errorf("%d mounts left under %s", n, dir)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s still exists (stat: %v)", dir, err)
	}
	if err := RemoveNamespaces(dir); err != nil {
		t.Errorf("second remove: %v", err)
	}
}

// mountsUnder counts mount points at or below dir.
func mountsUnder(t *testing.T, dir string) int {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for line := range strings.Lines(string(data)) {
		// Field 5 is the mount point (no spaces in our temp paths).
		if f := strings.Fields(line); len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			n++
		}
	}
	return n
}
