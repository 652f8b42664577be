package runner

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Containers can write into their volumes, so any path noderun resolves
// inside one may hold links a hostile process planted. Everything here
// resolves relative to an opened directory with the kernel's openat2
// guarantees (before Linux 5.6, walkBeneath's) instead of following path
// strings (the bug class of CVE-2017-1002101 and CVE-2021-25741 in the
// kubelet).

// errEscapes marks a path whose resolution leaves its volume.
var errEscapes = errors.New("resolves outside the volume")

// openDir opens a directory noderun owns (no component a container can
// write) as an O_PATH handle.
func openDir(dir string) (int, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	return fd, nil
}

// openBeneath opens rel below the directory rootFD. Links are followed only
// while they stay below it: an absolute link or a ".." that climbs out
// fails with errEscapes, as do /proc magic links.
func openBeneath(rootFD int, rel string, flags uint64) (int, error) {
	if rel == "" {
		rel = "."
	}
	fd, err := openat2(rootFD, rel, &unix.OpenHow{
		Flags:   flags | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err == unix.EXDEV || err == unix.ELOOP {
		return -1, fmt.Errorf("%s: %w", rel, errEscapes)
	}
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: rel, Err: err}
	}
	return fd, nil
}

// openSubPath resolves subPath inside the volume at root and returns an
// O_PATH handle to it. Missing directories are created one at a time with
// mkdirat in the already resolved parent, with the volume root's mode (as
// the kubelet does, so an fsGroup can write there), never through a link.
func openSubPath(root, subPath string) (*os.File, error) {
	rootFD, err := openDir(root)
	if err != nil {
		return nil, err
	}
	defer unix.Close(rootFD)
	var st unix.Stat_t
	if err := unix.Fstat(rootFD, &st); err != nil {
		return nil, err
	}
	parts := strings.Split(filepath.Clean(subPath), "/")
	for i := range parts {
		prefix := filepath.Join(parts[:i+1]...)
		fd, err := openBeneath(rootFD, prefix, unix.O_PATH)
		if errors.Is(err, unix.ENOENT) {
			err = mkdirBeneath(rootFD, filepath.Join(parts[:i]...), parts[i], st.Mode&0o7777)
			if err == nil {
				fd, err = openBeneath(rootFD, prefix, unix.O_PATH)
			}
		}
		if err != nil {
			return nil, err
		}
		if i == len(parts)-1 {
			return os.NewFile(uintptr(fd), filepath.Join(root, prefix)), nil
		}
		unix.Close(fd)
	}
	return nil, fmt.Errorf("empty subPath")
}

// mkdirBeneath creates name in the directory parent (resolved below rootFD)
// and sets its mode despite the umask.
func mkdirBeneath(rootFD int, parent, name string, mode uint32) error {
	pfd, err := openBeneath(rootFD, parent, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if err := unix.Mkdirat(pfd, name, mode); err != nil && err != unix.EEXIST {
		return &os.PathError{Op: "mkdir", Path: name, Err: err}
	}
	fd, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: name, Err: err}
	}
	defer unix.Close(fd)
	return unix.Fchmod(fd, mode)
}

// bindSubPath pins what h resolved to by bind-mounting it on target, a path
// in noderun's own state dir: runc then mounts target, which no container
// can redirect, instead of a path inside the volume.
func bindSubPath(h *os.File, target string) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(h.Fd()), &st); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		return err
	}
	if isMounted(target) {
		if err := unix.Unmount(target, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmount %s: %w", target, err)
		}
	}
	// The target's type must match the source's: a directory or a file.
	_ = os.Remove(target)
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if err := os.Mkdir(target, 0o750); err != nil {
			return err
		}
	} else {
		f, err := os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o640)
		if err != nil {
			return err
		}
		f.Close()
	}
	src := "/proc/self/fd/" + strconv.Itoa(int(h.Fd()))
	if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s: %w", target, err)
	}
	return nil
}

// isMounted reports whether path is a mount point, from mountinfo: a bind
// of a directory of the same file system shares the parent's device.
func isMounted(path string) bool {
	for _, m := range mountsUnder(filepath.Dir(path)) {
		if m == path {
			return true
		}
	}
	return false
}

// mountsUnder lists the mount points at or below dir, deepest first, so
// they can be unmounted in order.
func mountsUnder(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescapeMountinfo(f[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	// Longer paths are deeper; reverse mount order also unstacks repeats.
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

// unescapeMountinfo undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountAll detaches every mount at or below dir, so that removing dir can
// never descend into a volume or host path bound there.
func unmountAll(dir string) error {
	for _, mp := range mountsUnder(dir) {
		if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("unmount %s: %w", mp, err)
		}
	}
	return nil
}

// RemoveTree unmounts everything at or below dir, then removes dir, so that
// removing noderun's directories never descends into a host path bound
// beneath them (a volume, a pinned namespace, a rootfs).
func RemoveTree(dir string) error {
	if err := unmountAll(dir); err != nil {
		return err
	}
	if left := mountsUnder(dir); len(left) > 0 {
		return fmt.Errorf("remove %s: %s is still mounted", dir, left[0])
	}
	return os.RemoveAll(dir)
}
