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

// eachLayout runs f with every pin in the sandbox dir and with ipc and uts
// in a holder.
func eachLayout(t *testing.T, f func(t *testing.T, h *Holder)) {
	requireRoot(t)
	t.Run("in-dir", func(t *testing.T) { f(t, nil) })
	t.Run("holder", func(t *testing.T) { f(t, openTestHolder(t, filepath.Join(t.TempDir(), "ns"))) })
}

// openTestHolder opens a holder in dir that is unpinned at cleanup.
func openTestHolder(t *testing.T, dir string) *Holder {
	t.Helper()
	h, err := OpenHolder(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.Close()
		unix.Unmount(filepath.Join(dir, holderPin), unix.MNT_DETACH)
		unix.Unmount(dir, unix.MNT_DETACH)
	})
	return h
}

// heldDir is where a pod's ipc and uts pins are.
func heldDir(h *Holder, dir string) string {
	if h == nil {
		return dir
	}
	return filepath.Join(h.Root(), filepath.Base(dir))
}

func TestCreateNamespaces(t *testing.T) { eachLayout(t, testCreateNamespaces) }

func testCreateNamespaces(t *testing.T, h *Holder) {
	dir := filepath.Join(t.TempDir(), "pod")
	nss, err := CreateNamespaces(dir, "web-0", false, h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { RemoveNamespaces(dir, h) })

	held := heldDir(h, dir)
	want := Namespaces{Net: dir + "/net", IPC: held + "/ipc", UTS: held + "/uts"}
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
	ipc := inode(t, nss.IPC)
	again, err := CreateNamespaces(dir, "web-0", false, h)
	if err != nil {
		t.Fatal(err)
	}
	if again != nss || inode(t, again.Net) != before || inode(t, again.IPC) != ipc {
		t.Errorf("repeat gave %+v (net inode %d), want %+v (net inode %d)", again, inode(t, again.Net), nss, before)
	}
	wantMounts := 3
	if h != nil {
		wantMounts = 1 // only net: ipc and uts are not in the host's mount table
	}
	if n := mountsUnder(t, dir); n != wantMounts {
		t.Errorf("%d mounts under %s after repeat, want %d", n, dir, wantMounts)
	}

	// A second pod gets namespaces of its own.
	dir2 := filepath.Join(t.TempDir(), "pod2")
	nss2, err := CreateNamespaces(dir2, "web-1", false, h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { RemoveNamespaces(dir2, h) })
	for _, k := range [][2]string{{nss.Net, nss2.Net}, {nss.IPC, nss2.IPC}, {nss.UTS, nss2.UTS}} {
		if inode(t, k[0]) == inode(t, k[1]) {
			t.Errorf("two pods share a namespace: %s and %s", k[0], k[1])
		}
	}
}

func TestCreateNamespacesHostNetwork(t *testing.T) { eachLayout(t, testCreateNamespacesHostNetwork) }

func testCreateNamespacesHostNetwork(t *testing.T, h *Holder) {
	dir := filepath.Join(t.TempDir(), "pod")
	nss, err := CreateNamespaces(dir, "ignored", true, h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { RemoveNamespaces(dir, h) })
	if want := (Namespaces{IPC: heldDir(h, dir) + "/ipc"}); nss != want {
		t.Fatalf("got %+v, want %+v", nss, want)
	}
	if inode(t, nss.IPC) == inode(t, "/proc/self/ns/ipc") {
		t.Error("ipc namespace is the host's")
	}
	for _, p := range []string{filepath.Join(dir, "net"), filepath.Join(heldDir(h, dir), "uts")} {
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s pinned for a hostNetwork pod (stat: %v)", p, err)
		}
	}
}

func TestCreateNamespacesRepairsPartial(t *testing.T) {
	eachLayout(t, testCreateNamespacesRepairsPartial)
}

func testCreateNamespacesRepairsPartial(t *testing.T, h *Holder) {
	dir := filepath.Join(t.TempDir(), "pod")
	nss, err := CreateNamespaces(dir, "web-0", false, h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { RemoveNamespaces(dir, h) })
	ipc := inode(t, nss.IPC)
	// As after a crash between pins: uts never mounted, a bare file left.
	unpinUTS := func() error { return unpin(nss.UTS) }
	bareFile := func() error { return os.WriteFile(nss.UTS, nil, 0o444) }
	if h != nil {
		inHolder := "/" + holderPods + "/pod/uts"
		unpinUTS = func() error { return h.inside(func() error { return unpin(inHolder) }) }
		bareFile = func() error { return h.inside(func() error { return os.WriteFile(inHolder, nil, 0o444) }) }
	}
	if err := unpinUTS(); err != nil {
		t.Fatal(err)
	}
	if err := bareFile(); err != nil {
		t.Fatal(err)
	}

	if _, err := CreateNamespaces(dir, "web-0", false, h); err != nil {
		t.Fatal(err)
	}
	if inode(t, nss.IPC) != ipc {
		t.Error("repair replaced the ipc namespace that was still pinned")
	}
	if live, err := IsNamespace(nss.UTS); err != nil || !live {
		t.Errorf("uts not pinned after repair (live=%v, err=%v)", live, err)
	}
}

func TestRemoveNamespaces(t *testing.T) { eachLayout(t, testRemoveNamespaces) }

func testRemoveNamespaces(t *testing.T, h *Holder) {
	dir := filepath.Join(t.TempDir(), "pod")
	if _, err := CreateNamespaces(dir, "web-0", false, h); err != nil {
		t.Fatal(err)
	}
	if err := RemoveNamespaces(dir, h); err != nil {
		t.Fatal(err)
	}
	if n := mountsUnder(t, dir); n != 0 {
		t.Errorf("%d mounts left under %s", n, dir)
	}
	for _, p := range []string{dir, heldDir(h, dir)} {
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s still exists (stat: %v)", p, err)
		}
	}
	if err := RemoveNamespaces(dir, h); err != nil {
		t.Errorf("second remove: %v", err)
	}
}

// mountsUnder counts mount points at or below dir.
func mountsUnder(t *testing.T, dir string) int {
	t.Helper()
	return countMounts(t, func(point, _ string) bool { return point == dir || strings.HasPrefix(point, dir+"/") })
}

// countMounts counts the host's mounts (mount point, filesystem type) that
// match.
func countMounts(t *testing.T, match func(point, fstype string) bool) int {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for line := range strings.Lines(string(data)) {
		// No spaces in the test's paths.
		pre, post, _ := strings.Cut(line, " - ")
		if f, fs := strings.Fields(pre), strings.Fields(post); len(f) > 4 && len(fs) > 0 && match(f[4], fs[0]) {
			n++
		}
	}
	return n
}
