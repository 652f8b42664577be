package runner

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
)

// applyFSGroup gives a volume to the pod's fsGroup as the kubelet's
// SetVolumeOwnership does: every entry group-owned by it and group
// read-write, directories also setgid and group-searchable, so files
// created there belong to the group. OnRootMismatch skips the walk when the
// root already looks right. Links are never followed: the walk goes from
// directory handle to directory handle, since a container may swap any
// entry for a link while it runs.
func applyFSGroup(dir string, sc *v1.PodSecurityContext) error {
	if sc == nil || sc.FSGroup == nil {
		return nil
	}
	gid := int(*sc.FSGroup)
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(fd)
	if p := sc.FSGroupChangePolicy; p != nil && *p == v1.FSGroupChangeOnRootMismatch && ownedBy(fd, gid) {
		return nil
	}
	return chownTree(fd, gid)
}

// groupRW is what the kubelet adds to every file of the volume.
const groupRW = 0o660

// dirMask is what directories get: rw and search for owner and group, setgid.
const dirMask = groupRW | 0o110 | unix.S_ISGID

// ownedBy reports whether the directory fd already has the fsGroup setup.
func ownedBy(fd, gid int) bool {
	var st unix.Stat_t
	return unix.Fstat(fd, &st) == nil && int(st.Gid) == gid && st.Mode&dirMask == dirMask
}

// chownTree sets group and mode on the directory fd and everything below.
func chownTree(fd, gid int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if err := unix.Fchown(fd, -1, gid); err != nil {
		return err
	}
	if err := unix.Fchmod(fd, (st.Mode&0o7777)|dirMask); err != nil {
		return err
	}
	dup, err := unix.Dup(fd)
	if err != nil {
		return err
	}
	d := os.NewFile(uintptr(dup), "")
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range names {
		errs = append(errs, chownEntry(fd, name, gid))
	}
	return errors.Join(errs...)
}

// chownEntry handles one entry of the directory fd: links are left alone,
// directories are descended into through a handle opened without
// following links, anything else is changed in place by name relative to
// fd with AT_SYMLINK_NOFOLLOW.
func chownEntry(fd int, name string, gid int) error {
	var st unix.Stat_t
	if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return ignoreGone(err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFLNK:
		return nil
	case unix.S_IFDIR:
		sub, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return ignoreGone(err)
		}
		defer unix.Close(sub)
		return chownTree(sub, gid)
	}
	if err := unix.Fchownat(fd, name, -1, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return ignoreGone(err)
	}
	err := unix.Fchmodat(fd, name, (st.Mode&0o7777)|groupRW, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.EOPNOTSUPP) {
		err = fchmodRegular(fd, name, (st.Mode&0o7777)|groupRW)
	}
	return ignoreGone(err)
}

// fchmodRegular is the fallback for kernels before fchmodat2 (6.6): only a
// regular file is opened (O_NOFOLLOW) and changed through its handle.
func fchmodRegular(fd int, name string, mode uint32) error {
	f, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(f)
	var st unix.Stat_t
	if err := unix.Fstat(f, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return err
	}
	return unix.Fchmod(f, mode)
}

// ignoreGone: an entry a container removed during the walk is no error.
func ignoreGone(err error) error {
	if errors.Is(err, unix.ENOENT) || err == nil {
		return nil
	}
	return fmt.Errorf("fsGroup: %w", err)
}
