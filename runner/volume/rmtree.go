package volume

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrMountPoint marks a removal that stopped at a mount point: below it lies
// another file system, or another part of this one bound there (a host
// path), which is not noderun's to delete.
var ErrMountPoint = errors.New("is a mount point; not removing what is mounted there")

// RemoveOnMount removes path and everything below it, as os.RemoveAll does,
// but never descends into a directory on another mount than its parent's:
// it fails with ErrMountPoint instead. The mount is compared on the handle
// it then reads, so nothing can be swapped in between; links are removed,
// never followed. A mount on a file is safe: unlink fails with EBUSY.
func RemoveOnMount(path string) error {
	path = filepath.Clean(path)
	pfd, err := unix.Open(filepath.Dir(path), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return &os.PathError{Op: "open", Path: filepath.Dir(path), Err: err}
	}
	defer unix.Close(pfd)
	return removeOnMountAt(pfd, filepath.Base(path), path)
}

// removeOnMountAt removes name in the directory pfd; path names it for errors.
func removeOnMountAt(pfd int, name, path string) error {
	err := unix.Unlinkat(pfd, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) {
		return &os.PathError{Op: "unlink", Path: path, Err: err}
	}
	fd, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return &os.PathError{Op: "open", Path: path, Err: err}
	}
	dir := os.NewFile(uintptr(fd), path)
	defer dir.Close()
	names, err := namesOnMount(pfd, dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range names {
		errs = append(errs, removeOnMountAt(fd, n, filepath.Join(path, n)))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := unix.Unlinkat(pfd, name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		return &os.PathError{Op: "rmdir", Path: path, Err: err}
	}
	return nil
}

// namesOnMount lists the entries of dir, which must be on the mount of
// the directory pfd (ErrMountPoint).
func namesOnMount(pfd int, dir *os.File) ([]string, error) {
	same, err := sameMount(pfd, int(dir.Fd()))
	if err != nil {
		return nil, &os.PathError{Op: "stat", Path: dir.Name(), Err: err}
	}
	if !same {
		return nil, fmt.Errorf("%s %w", dir.Name(), ErrMountPoint)
	}
	return dir.Readdirnames(-1)
}

// sameMount reports whether the two open files are on one mount, by the
// kernel's mount IDs, which tell a bind mount of a directory of the same
// file system apart where the device cannot.
func sameMount(a, b int) (bool, error) {
	ma, err := mountID(a)
	if err != nil {
		return false, err
	}
	mb, err := mountID(b)
	if err != nil {
		return false, err
	}
	return ma == mb, nil
}

// mountID is the mount ID of an open file: from statx (Linux 5.8), else from
// /proc/self/fdinfo (Linux 3.15), so kernels from 5.4 on and emulators that
// lack STATX_MNT_ID still tell a bind apart (qemu-user 7.2 sets the mask but
// leaves the ID 0, which no mount has). Without either it fails: a removal
// that cannot see mounts must not guess.
func mountID(fd int) (uint64, error) {
	var st unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_MNT_ID, &st); err == nil && st.Mask&unix.STATX_MNT_ID != 0 && st.Mnt_id != 0 {
		return st.Mnt_id, nil
	}
	return fdinfoMountID(fd)
}

// fdinfoMountID reads the mnt_id line of /proc/self/fdinfo/<fd>.
func fdinfoMountID(fd int) (uint64, error) {
	b, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(fd))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "mnt_id:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("fd %d: no mnt_id in /proc/self/fdinfo", fd)
}

// RemoveFilesIn removes the entries of dir that match selects, each as
// os.Remove does (a file, a link, an empty directory), where a process
// other than noderun may write below root (a pod log dir under a pod's
// hostPath): dir is reached following no link below root and must be on
// root's mount, and each entry is unlinked relative to dir's handle, so a
// link or mount planted on the way leads nowhere.
func RemoveFilesIn(root, dir string, match func(name string) bool) error {
	rel, err := filepath.Rel(root, dir)
	if err != nil || !filepath.IsLocal(rel) {
		return fmt.Errorf("%s is not below %s", dir, root)
	}
	rootFD, err := openDir(root)
	if err != nil {
		return err
	}
	defer unix.Close(rootFD)
	fd, err := openat2(rootFD, rel, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	d := os.NewFile(uintptr(fd), dir)
	defer d.Close()
	names, err := namesOnMount(rootFD, d)
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range names {
		if match(n) {
			errs = append(errs, removeEntry(fd, n, filepath.Join(dir, n)))
		}
	}
	return errors.Join(errs...)
}

// removeEntry removes name in the directory fd as os.Remove does; an empty
// directory that is a mount point stays (EBUSY).
func removeEntry(fd int, name, path string) error {
	err := unix.Unlinkat(fd, name, 0)
	if errors.Is(err, unix.EISDIR) {
		err = unix.Unlinkat(fd, name, unix.AT_REMOVEDIR)
	}
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return &os.PathError{Op: "remove", Path: path, Err: err}
	}
	return nil
}
