package layout

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// ErrLocked means another noderun runs on the same directories.
var ErrLocked = errors.New("another noderun uses these directories")

// Lock takes the single-instance lock of the state and run dirs (lockDirs).
func (l Layout) Lock() (release func(), err error) {
	return lockDirs(l.State, l.Run)
}

// LockExisting takes the single-instance lock of those of the state and
// run dirs that exist: reset creates none of them.
func (l Layout) LockExisting() (release func(), err error) {
	var have []string
	for _, d := range []string{l.State, l.Run} {
		if _, err := os.Stat(d); err == nil {
			have = append(have, d)
		}
	}
	return lockDirs(have...)
}

// lockDirs takes an exclusive flock on <dir>/lock in each dir and writes our
// PID into it, so that a second noderun on the same directories stops
// before it touches anything (the status socket, other pods). The locks
// last until release, or until the process exits, however it exits.
func lockDirs(dirs ...string) (release func(), err error) {
	var held []*os.File
	closeAll := func() {
		for _, f := range held {
			f.Close()
		}
	}
	var locked []string
	for _, dir := range dirs {
		path := filepath.Join(dir, "lock")
		if slices.Contains(locked, path) {
			continue // one dir given twice: a second flock would fail on our own
		}
		locked = append(locked, path)
		f, err := lockFile(path)
		if err != nil {
			closeAll()
			return nil, err
		}
		held = append(held, f)
	}
	return closeAll, nil
}

// deadHolderWait bounds the wait for a lock whose holder has exited: a
// child it was starting holds the lock's descriptor until its exec closes
// it, which on a busy machine outlived a kill -9 and the restart after it.
var deadHolderWait = 5 * time.Second

func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(deadHolderWait)
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if !errors.Is(err, unix.EWOULDBLOCK) || alive(holder(path)) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s is held by pid %s", ErrLocked, path, holder(path))
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err != nil {
		f.Close()
		return nil, err
	}
	if _, err := f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// alive says whether the process pid names runs (a zombie has closed its
// files, so holds no lock); a holder that has not written its PID yet is
// taken as running.
func alive(pid string) bool {
	n, err := strconv.Atoi(pid)
	if err != nil || n <= 0 {
		return true
	}
	if err := unix.Kill(n, 0); errors.Is(err, unix.ESRCH) {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", n))
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	// The state follows the command's closing parenthesis.
	i := strings.LastIndexByte(string(b), ')')
	return i < 0 || i+2 >= len(b) || b[i+2] != 'Z'
}

// holder reads the PID the lock's holder wrote; "unknown" when it has not
// written it yet.
func holder(path string) string {
	b, _ := os.ReadFile(path)
	if pid := strings.TrimSpace(string(b)); pid != "" {
		return pid
	}
	return "unknown"
}
