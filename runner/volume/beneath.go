package volume

import (
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// openat2 is unix.Openat2 retried as the kernel asks (EAGAIN after a
// rename or mount raced a ".." lookup). On kernels without openat2 (Linux
// before 5.6) it resolves path with walkBeneath instead, which gives the
// same answers for the RESOLVE_BENEATH lookups noderun makes.
func openat2(dirfd int, path string, how *unix.OpenHow) (int, error) {
	for {
		fd, err := unix.Openat2(dirfd, path, how)
		switch err {
		case unix.EAGAIN, unix.EINTR:
			continue
		case unix.ENOSYS:
			return walkBeneath(dirfd, path, how)
		}
		return fd, err
	}
}

// maxLinks is the kernel's limit of links followed in one lookup (ELOOP).
const maxLinks = 40

// walkBeneath does what openat2 does with RESOLVE_BENEATH and
// RESOLVE_NO_MAGICLINKS (and RESOLVE_NO_SYMLINKS if asked), one component
// at a time, as the kubelet's doSafeOpen does: each component is opened
// O_PATH|O_NOFOLLOW relative to the handle of its parent, so a link is
// never followed by the kernel, only read and spliced into the rest of the
// path. An absolute link, or a ".." above dirfd, fails with EXDEV; a link
// on procfs (where magic links live), too many links, or any link under
// RESOLVE_NO_SYMLINKS fails with ELOOP. ".." returns to the handle the
// walk came from, never looks up a parent a rename could have changed.
// Only the final component is opened with how.Flags, through the O_PATH
// handle already resolved (/proc/self/fd), so it is the inode checked.
func walkBeneath(dirfd int, path string, how *unix.OpenHow) (int, error) {
	if how.Resolve&unix.RESOLVE_BENEATH == 0 {
		return -1, unix.EINVAL // only the lookups noderun makes are emulated
	}
	if strings.HasPrefix(path, "/") {
		return -1, unix.EXDEV
	}
	flags := int(how.Flags) | unix.O_CLOEXEC
	create, excl := flags&unix.O_CREAT != 0, flags&unix.O_CREAT != 0 && flags&unix.O_EXCL != 0
	noFollow := flags&unix.O_NOFOLLOW != 0 || excl
	var dirs []int // handles below dirfd walked through, innermost last
	defer func() {
		for _, d := range dirs {
			unix.Close(d)
		}
	}()
	cur := func() int {
		if len(dirs) == 0 {
			return dirfd
		}
		return dirs[len(dirs)-1]
	}
	todo := components(path)
	links := 0
	for len(todo) > 0 {
		name := todo[0]
		todo = todo[1:]
		if name == ".." {
			if len(dirs) == 0 {
				return -1, unix.EXDEV
			}
			unix.Close(dirs[len(dirs)-1])
			dirs = dirs[:len(dirs)-1]
			continue
		}
		last := len(todo) == 0
		fd, err := unix.Openat(cur(), name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err == unix.ENOENT && last && create {
			// Made anew in the resolved parent; a link planted since
			// fails (EEXIST with O_EXCL, ELOOP without).
			return unix.Openat(cur(), name, flags|unix.O_NOFOLLOW, uint32(how.Mode))
		}
		if err != nil {
			return -1, err
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return -1, err
		}
		switch {
		case last && excl:
			unix.Close(fd)
			return -1, unix.EEXIST
		case st.Mode&unix.S_IFMT == unix.S_IFLNK && last && noFollow:
			if flags&unix.O_PATH != 0 {
				return fd, nil // as the kernel: O_PATH|O_NOFOLLOW opens the link
			}
			unix.Close(fd)
			return -1, unix.ELOOP
		case st.Mode&unix.S_IFMT == unix.S_IFLNK:
			target, err := readLink(fd, how.Resolve, &links)
			unix.Close(fd)
			if err != nil {
				return -1, err
			}
			todo = append(components(target), todo...)
		case last:
			return reopen(fd, &st, flags)
		case st.Mode&unix.S_IFMT != unix.S_IFDIR:
			unix.Close(fd)
			return -1, unix.ENOTDIR
		default:
			dirs = append(dirs, fd)
		}
	}
	// The path named a directory already walked to (".", "a/..").
	return unix.Openat(cur(), ".", flags&^(unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW), 0)
}

// components splits a relative path, dropping empty and "." parts.
func components(path string) []string {
	var out []string
	for _, c := range strings.Split(path, "/") {
		if c != "" && c != "." {
			out = append(out, c)
		}
	}
	return out
}

// readLink reads the link fd (an O_PATH handle) for walkBeneath, counting
// it against maxLinks and refusing what openat2 would refuse.
func readLink(fd int, resolve uint64, links *int) (string, error) {
	if resolve&unix.RESOLVE_NO_SYMLINKS != 0 {
		return "", unix.ELOOP
	}
	if *links++; *links > maxLinks {
		return "", unix.ELOOP
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil {
		return "", err
	}
	if fs.Type == unix.PROC_SUPER_MAGIC {
		return "", unix.ELOOP // a magic link, or a plain one next to them
	}
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(fd, "", buf)
	if err != nil {
		return "", err
	}
	target := string(buf[:n])
	if strings.HasPrefix(target, "/") {
		return "", unix.EXDEV
	}
	return target, nil
}

// reopen turns the O_PATH handle fd (which it takes) into the open
// walkBeneath was asked for: an O_PATH open is the handle itself, anything
// else goes through /proc/self/fd, which reaches that very inode whatever
// the path holds by now.
func reopen(fd int, st *unix.Stat_t, flags int) (int, error) {
	if flags&unix.O_DIRECTORY != 0 && st.Mode&unix.S_IFMT != unix.S_IFDIR {
		unix.Close(fd)
		return -1, unix.ENOTDIR
	}
	if flags&unix.O_PATH != 0 {
		return fd, nil
	}
	defer unix.Close(fd)
	return unix.Open("/proc/self/fd/"+strconv.Itoa(fd), flags&^(unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW), 0)
}
