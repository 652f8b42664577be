package testnode

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Mount is a line of the host's mount table: mount point and filesystem
// type.
type Mount struct{ Point, FSType string }

// MountsUnder lists the mounts at or below dir ("/" for all), in mount
// order.
func MountsUnder(dir string) ([]Mount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Mount
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// Fields: id parent maj:min root mountpoint opts ... - fstype source superopts
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		fields, fstype := strings.Fields(pre), strings.Fields(post)
		if !ok || len(fields) < 5 || len(fstype) == 0 {
			continue
		}
		if p := fields[4]; dir == "/" || p == dir || strings.HasPrefix(p, dir+"/") {
			out = append(out, Mount{p, fstype[0]})
		}
	}
	return out, sc.Err()
}

// UnmountUnder detaches every mount at or below dir, children first; one
// gone meanwhile (EINVAL) is not an error.
func UnmountUnder(dir string) error {
	ms, err := MountsUnder(dir)
	if err != nil {
		return err
	}
	slices.Reverse(ms)
	var errs []error
	for _, m := range ms {
		if err := unix.Unmount(m.Point, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", m.Point, err))
		}
	}
	return errors.Join(errs...)
}

// Proc is a host process and its command line (none for a kernel thread).
type Proc struct {
	PID  int
	Args []string
}

// Processes lists the host's processes; one gone while read is left out.
func Processes() ([]Proc, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []Proc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		var args []string
		if len(b) > 0 {
			args = strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
		}
		out = append(out, Proc{pid, args})
	}
	return out, nil
}

// CollectorPIDs are the log collectors that the noderun binary bin started
// for the run dir runDir: noderun leaves it running across its restarts.
func CollectorPIDs(bin, runDir string) []int {
	want := []string{bin, "log-collector", filepath.Join(runDir, "log-collector.sock")}
	procs, _ := Processes() // none: no collector
	var pids []int
	for _, p := range procs {
		if slices.Equal(p.Args, want) {
			pids = append(pids, p.PID)
		}
	}
	return pids
}

// StatusValues reads the first number of each of the keys (as "VmRSS",
// in the file's units) from /proc/<pid>/status; a key not there is an
// error.
func StatusValues(pid int, keys ...string) (map[string]float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, ":")
		if f := strings.Fields(v); len(f) > 0 && slices.Contains(keys, k) {
			if out[k], err = strconv.ParseFloat(f[0], 64); err != nil {
				return nil, fmt.Errorf("/proc/%d/status %s: %w", pid, k, err)
			}
		}
	}
	for _, k := range keys {
		if _, ok := out[k]; !ok {
			return nil, fmt.Errorf("no %s in /proc/%d/status", k, pid)
		}
	}
	return out, nil
}

// FDs counts a process's open file descriptors and the inotify instances
// among them.
func FDs(pid int) (fds, inotify int, err error) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, 0, err
	}
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && l == "anon_inode:inotify" {
			inotify++
		}
	}
	return len(ents), inotify, nil
}

// userHZ is the unit of /proc/<pid>/stat times; the kernel fixes it at 100
// for user space.
const userHZ = 100

// CPUTime is a process's user+system CPU time so far.
func CPUTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// After the parenthesised command name (which may hold ')'): state is
	// field 3, utime 14, stime 15.
	i := bytes.LastIndexByte(b, ')')
	fields := strings.Fields(string(b[i+1:]))
	if i < 0 || len(fields) < 13 {
		return 0, errors.New("short /proc stat")
	}
	var ticks uint64
	for _, f := range fields[11:13] {
		v, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return 0, err
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// Alive reports whether pid is a process that has not exited (a zombie
// has).
func Alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command, which is in parentheses.
	_, rest, _ := strings.Cut(string(b), ") ")
	return !strings.HasPrefix(rest, "Z")
}

// EndProcess sends pid SIGTERM and waits until it is gone (its parent or
// init reaps it), or kills it after timeout.
func EndProcess(pid int, timeout time.Duration) {
	_ = syscall.Kill(pid, syscall.SIGTERM)
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if syscall.Kill(pid, 0) != nil {
			return
		}
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
}
