package volume

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
)

// ApplyFSGroup gives a volume to the pod's fsGroup as the kubelet's
// SetVolumeOwnership does: every entry group-owned by it and group
// read-write, directories also setgid and group-searchable, so files
// created there belong to the group. OnRootMismatch skips the walk when the
// root already looks right. Links are never followed: the walk goes from
// directory handle to directory handle, since a container may swap any
// entry for a link while it runs.
func ApplyFSGroup(dir string, sc *v1.PodSecurityContext) error {
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

// chownEntry handles one entry of the directory fd. No entry but a
// directory is ever opened to be changed: it is taken as an O_PATH handle,
// which runs no driver's open (a device node or FIFO a container planted
// stays closed), and changed through that handle. Directories are
// descended into through a handle opened without following links. Links
// get the group, as the kubelet's Lchown does, and never a mode.
func chownEntry(fd int, name string, gid int) error {
	h, err := unix.Openat(fd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return ignoreGone(err)
	}
	defer unix.Close(h)
	var st unix.Stat_t
	if err := unix.Fstat(h, &st); err != nil {
		return ignoreGone(err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		sub, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return ignoreGone(err)
		}
		defer unix.Close(sub)
		return chownTree(sub, gid)
	}
	if err := unix.Fchownat(h, "", -1, gid, unix.AT_EMPTY_PATH); err != nil || st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return ignoreGone(err)
	}
	// chmod of the handle's /proc/self/fd link reaches its inode without
	// an open, on every kernel (fchmodat2 came with 6.6). The handle keeps
	// the inode, so no error here means the entry is gone.
	if err := unix.Chmod("/proc/self/fd/"+strconv.Itoa(h), (st.Mode&0o7777)|groupRW); err != nil {
		return fmt.Errorf("fsGroup: chmod %s: %w", name, err)
	}
	return nil
}

// ignoreGone: an entry a container removed during the walk is no error.
func ignoreGone(err error) error {
	if errors.Is(err, unix.ENOENT) || err == nil {
		return nil
	}
	return fmt.Errorf("fsGroup: %w", err)
}
