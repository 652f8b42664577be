package volume

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// walkBeneath answers as openat2 does: the same inode opened the same
// way, or the same error, for lookups through every kind of planted link.
func TestWalkBeneath(t *testing.T) {
	if fd, err := unix.Openat2(unix.AT_FDCWD, "/", &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC}); err != nil {
		t.Skipf("no openat2 to compare with: %v", err) // the volume tests cover the walk then
	} else {
		unix.Close(fd)
	}
	vol, _ := hostileVolume(t)
	if err := os.WriteFile(filepath.Join(vol, "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{
		"chain": "inside", "loop1": "loop2", "loop2": "loop1", "dangling": "nothing",
		"tofile": "file", "deeplink": "real/deep/../deep", "climb": "real/../../host",
	} {
		if err := os.Symlink(target, filepath.Join(vol, link)); err != nil {
			t.Fatal(err)
		}
	}
	root, err := openDir(vol)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(root)
	proc, err := openDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(proc)

	const (
		beneath   = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS
		noLinks   = beneath | unix.RESOLVE_NO_SYMLINKS
		path      = unix.O_PATH
		dir       = unix.O_RDONLY | unix.O_DIRECTORY
		read      = unix.O_RDONLY
		create    = unix.O_WRONLY | unix.O_CREAT | unix.O_EXCL | unix.O_NOFOLLOW
		pathNoFol = unix.O_PATH | unix.O_NOFOLLOW
	)
	for _, c := range []struct {
		dirfd   int
		path    string
		flags   uint64
		resolve uint64
	}{
		{root, ".", path, beneath},
		{root, "real", path, beneath},
		{root, "real/deep", dir, beneath},
		{root, "inside/deep", path, beneath},
		{root, "chain/deep", dir, beneath},
		{root, "deeplink", dir, beneath},
		{root, "inside/../file", read, beneath},
		{root, "real/deep/../..", path, beneath},
		{root, "tofile", read, beneath},
		{root, "tofile", dir, beneath},
		{root, "file/x", path, beneath},
		{root, "missing", path, beneath},
		{root, "missing/x", path, beneath},
		{root, "dangling", path, beneath},
		{root, "real/..", path, beneath},
		// escapes
		{root, "..", path, beneath},
		{root, "real/../..", path, beneath},
		{root, "up", path, beneath},
		{root, "climb", path, beneath},
		{root, "root", path, beneath},
		{root, "root/etc", path, beneath},
		{root, "hostdir", path, beneath},
		{root, "abs-in", path, beneath},
		{root, "selfref", path, beneath},
		{root, "/etc", path, beneath},
		{root, "loop1", path, beneath},
		// magic links
		{proc, "self/root", path, beneath},
		{proc, "thread-self/cwd", dir, beneath},
		// no links at all, or not the final one
		{root, "real/deep", path, noLinks},
		{root, "inside/deep", path, noLinks},
		{root, "tofile", read, noLinks},
		{root, "tofile", read | unix.O_NOFOLLOW, beneath},
		{root, "tofile", pathNoFol, beneath},
		// creating
		{root, "real/deep/new", create, noLinks},
		{root, "file", create, noLinks},
		{root, "dangling", create, beneath},
		{root, "inside/new", create, noLinks},
	} {
		how := &unix.OpenHow{Flags: c.flags | unix.O_CLOEXEC, Resolve: c.resolve}
		if c.flags&unix.O_CREAT != 0 {
			how.Mode = 0o600 // openat2 refuses a mode without O_CREAT
		}
		want, werr := unix.Openat2(c.dirfd, c.path, how)
		if werr == nil && c.flags&unix.O_CREAT != 0 {
			unix.Close(want)
			want, werr = -1, nil
			if err := unix.Unlinkat(c.dirfd, c.path, 0); err != nil {
				t.Fatal(err)
			}
		}
		got, gerr := walkBeneath(c.dirfd, c.path, how)
		switch {
		case gerr != werr:
			t.Errorf("%q (flags %#o, resolve %#x): walk %v, openat2 %v", c.path, c.flags, c.resolve, gerr, werr)
		case gerr == nil && want != -1 && !sameOpen(t, got, want):
			t.Errorf("%q (flags %#o): walk and openat2 opened different files", c.path, c.flags)
		}
		for _, fd := range []int{got, want} {
			if fd >= 0 {
				unix.Close(fd)
			}
		}
	}
}

// sameOpen: the same inode, opened with the same access and O_PATH.
func sameOpen(t *testing.T, a, b int) bool {
	t.Helper()
	var sa, sb unix.Stat_t
	if err := unix.Fstat(a, &sa); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fstat(b, &sb); err != nil {
		t.Fatal(err)
	}
	fa, err := unix.FcntlInt(uintptr(a), unix.F_GETFL, 0)
	if err != nil {
		t.Fatal(err)
	}
	fb, err := unix.FcntlInt(uintptr(b), unix.F_GETFL, 0)
	if err != nil {
		t.Fatal(err)
	}
	const kind = unix.O_ACCMODE | unix.O_PATH
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino && fa&kind == fb&kind
}
