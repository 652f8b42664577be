package testenv

import (
	"testing"

	"golang.org/x/sys/unix"
)

// SharedMount makes dir a shared mount of its own, unmounted at cleanup:
// what mount propagation other than None needs of a hostPath's source, and
// what a host with systemd has for /.
func SharedMount(t testing.TB, dir string) {
	t.Helper()
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	if err := unix.Mount("", dir, "", unix.MS_SHARED, ""); err != nil {
		t.Fatal(err)
	}
}
