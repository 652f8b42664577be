package crilog

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// Logs live below the pod log dir (/var/log/pods), which a pod with a
// writable hostPath over /var/log (a log shipper's) can write to. The
// collector and the log reader run as root, so neither follows a link
// there: every directory below the root is opened component by component
// with O_NOFOLLOW, and every file relative to its directory's descriptor
// with O_NOFOLLOW, refusing what is not a regular file with one link (a
// hard link to a host file is as bad as a symbolic one). This works on
// every kernel, unlike openat2's RESOLVE_NO_SYMLINKS (5.6). The root itself
// is the administrator's setting and may be a link.

// errLink is a link, or something not a log, where a log was expected.
var errLink = errors.New("a link or not a regular file; not followed")

// openDirBelow opens dir, which is root or below it, following no link
// below root; mkdir creates the directories missing below root.
func openDirBelow(root, dir string, mkdir bool) (*os.File, error) {
	rel, err := filepath.Rel(root, dir)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return nil, fmt.Errorf("%s is not below %s", dir, root)
	}
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: root, Err: err}
	}
	at := root
	for _, name := range strings.Split(rel, "/") {
		if name == "." {
			continue
		}
		at = filepath.Join(at, name)
		next, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) && mkdir {
			if err = unix.Mkdirat(fd, name, 0o755); err == nil || errors.Is(err, unix.EEXIST) {
				next, err = unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			}
		}
		unix.Close(fd)
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return nil, fmt.Errorf("%s: %w", at, errLink)
		} else if err != nil {
			return nil, &os.PathError{Op: "open", Path: at, Err: err}
		}
		fd = next
	}
	return os.NewFile(uintptr(fd), dir), nil
}

// openIn opens the regular file name in dir without following a link.
// O_NONBLOCK keeps a FIFO planted there from blocking the open; it is
// refused next, with anything else that is not a log.
func openIn(dir *os.File, name string, flag int, perm uint32) (*os.File, error) {
	path := filepath.Join(dir.Name(), name)
	fd, err := unix.Openat(int(dir.Fd()), name, flag|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, perm)
	if errors.Is(err, unix.ELOOP) {
		return nil, fmt.Errorf("%s: %w", path, errLink)
	} else if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Nlink > 1 {
		unix.Close(fd)
		return nil, fmt.Errorf("%s: %w", path, errLink)
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), nil
}

// namesIn lists the entries of dir.
func namesIn(dir *os.File) ([]string, error) {
	if _, err := dir.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	return dir.Readdirnames(-1)
}

// rotatedNames lists the rotated files of the log name in dir, oldest
// first; .tmp files (a compression under way) are left out.
func rotatedNames(dir *os.File, name string) []string {
	names, _ := namesIn(dir)
	var out []string
	for _, n := range names {
		if strings.HasPrefix(n, name+".") && !strings.HasSuffix(n, ".tmp") {
			out = append(out, n)
		}
	}
	// Timestamps sort in time order, gzipped or not.
	slices.SortFunc(out, func(a, b string) int {
		return strings.Compare(strings.TrimSuffix(a, ".gz"), strings.TrimSuffix(b, ".gz"))
	})
	return out
}

// logRoot is the directory no link below which is followed: root, or the
// log's own directory when none is given.
func logRoot(root, path string) string {
	if root == "" {
		return filepath.Dir(path)
	}
	return root
}

// below reports whether path is below the directory root; both absolute.
func below(root, path string) bool {
	if !filepath.IsAbs(root) || !filepath.IsAbs(path) {
		return false
	}
	rel, err := filepath.Rel(root, path)
	return err == nil && rel != "." && rel != ".." && !strings.HasPrefix(rel, "../")
}

// OpenLog opens the log file at path for reading, following no link below
// root (see openDirBelow); "" for root is the log's own directory.
func OpenLog(root, path string) (*os.File, error) {
	dir, err := openDirBelow(logRoot(root, path), filepath.Dir(path), false)
	if err != nil {
		return nil, fmt.Errorf("crilog: read %s: %w", path, err)
	}
	defer dir.Close()
	f, err := openIn(dir, filepath.Base(path), unix.O_RDONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("crilog: read: %w", err)
	}
	return f, nil
}
