package volume

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/moby/sys/mountinfo"
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
	// The pin of an earlier start (of this container or a crashed noderun),
	// perhaps more than one stacked.
	for {
		mounted, err := mountinfo.Mounted(target)
		if errors.Is(err, fs.ErrNotExist) {
			break
		}
		if err != nil {
			return err
		}
		if !mounted {
			break
		}
		if err := unix.Unmount(target, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmount %s: %w", target, err)
		}
	}
	// The target's type must match the source's: a directory or a file.
	if err := os.Remove(target); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
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

// mountsUnder lists the mount points at or below dir, deepest first, so
// they can be unmounted in order. mountinfo names mount points by their
// resolved absolute path, so dir is resolved first: a state dir reached
// through a link, or given relative, is found all the same.
func mountsUnder(dir string) ([]string, error) {
	real, err := ResolvePath(dir)
	if err != nil {
		return nil, err
	}
	ms, err := mountinfo.GetMounts(mountinfo.PrefixFilter(real))
	if err != nil {
		return nil, err
	}
	// Reverse mount order unstacks repeats, and a mount below another was
	// made after it.
	out := make([]string, 0, len(ms))
	for i := len(ms) - 1; i >= 0; i-- {
		out = append(out, ms[i].Mountpoint)
	}
	return out, nil
}

// ResolvePath makes p absolute and resolves every link in it; the part
// that does not exist (yet) is kept as it is.
func ResolvePath(p string) (string, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", err
	}
	var rest []string
	for dir := abs; ; dir = filepath.Dir(dir) {
		real, err := filepath.EvalSymlinks(dir)
		if err == nil {
			return filepath.Join(append([]string{real}, rest...)...), nil
		}
		if !errors.Is(err, fs.ErrNotExist) || dir == "/" {
			return "", err
		}
		rest = append([]string{filepath.Base(dir)}, rest...)
	}
}

// UnmountAll detaches every mount at or below dir, so that removing dir can
// never descend into a volume or host path bound there.
func UnmountAll(dir string) error {
	mps, err := mountsUnder(dir)
	if err != nil {
		return err
	}
	for _, mp := range mps {
		if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("unmount %s: %w", mp, err)
		}
	}
	return nil
}

// RemoveTree unmounts everything at or below dir, then removes dir without
// ever leaving the mount dir is on, so that removing noderun's directories
// never descends into a host path bound beneath them (a volume, a pinned
// namespace, a rootfs), even one the unmount missed. Links in dir's parents
// are followed; dir itself, if a link, is removed, not followed.
func RemoveTree(dir string) error {
	parent, err := ResolvePath(filepath.Dir(dir))
	if err != nil {
		return err
	}
	real := filepath.Join(parent, filepath.Base(dir))
	st, err := os.Lstat(real)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if st.IsDir() {
		if err := UnmountAll(real); err != nil {
			return err
		}
	}
	return RemoveOnMount(real)
}

// OpenFileBeneath opens the regular file rel inside the volume at root for
// reading, never through a link that leaves it; anything but a regular
// file (a FIFO that would block, a device) is refused before it is opened.
func OpenFileBeneath(root, rel string) (*os.File, error) {
	rootFD, err := openDir(root)
	if err != nil {
		return nil, err
	}
	defer unix.Close(rootFD)
	fd, err := openBeneath(rootFD, filepath.Clean(rel), unix.O_PATH)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, fmt.Errorf("%s: not a regular file", rel)
	}
	if fd, err = reopen(fd, &st, unix.O_RDONLY|unix.O_CLOEXEC); err != nil {
		return nil, &os.PathError{Op: "open", Path: rel, Err: err}
	}
	return os.NewFile(uintptr(fd), filepath.Join(root, rel)), nil
}
