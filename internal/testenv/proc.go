package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// ParentPID returns a process's parent: for a container's PID 1, its
// containerd shim, which tests stop to stall it.
func ParentPID(t testing.TB, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the command name, which may hold spaces and ')'.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		t.Fatalf("/proc/%d/stat: %v", pid, err)
	}
	return ppid
}

// Stop sends SIGSTOP to pid and returns once every one of its threads has
// stopped: kill returns with the stop still on its way, and a thread not
// yet stopped can answer a request meanwhile. The process is continued at
// cleanup.
func Stop(t testing.TB, pid int) {
	t.Helper()
	p, err := os.FindProcess(pid) // a pidfd: the cleanup reaches this process only
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Signal(syscall.SIGCONT) })
	for deadline := time.Now().Add(10 * time.Second); !allStopped(pid); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("process %d not stopped 10s after SIGSTOP", pid)
		}
	}
}

// allStopped reports whether every thread of pid is in the stopped state.
func allStopped(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		if err != nil {
			return false
		}
		// The state follows the command, which may hold spaces and ')'.
		if f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:])); len(f) == 0 || f[0] != "T" {
			return false
		}
	}
	return true
}

// StartWithPID starts name with args as process pid, a pid that has just
// been freed, by setting the kernel's last given pid (ns_last_pid, as CRIU
// restores pids). A fork or a new thread anywhere on the machine may take
// the pid between the write and the start: when the task that took it is
// gone again it tries once more, and when it stays (a thread of a running
// daemon) it reports false, and the caller needs another freed pid. For
// tests that a process gone is never confused with the next one given its
// pid. The process is killed at cleanup.
func StartWithPID(t testing.TB, pid int, name string, args ...string) (*exec.Cmd, bool) {
	t.Helper()
	for try := 0; try < 100; try++ {
		// /proc/<pid> is there for any thread's id too, not only a process's.
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			t.Logf("pid %d taken by another task", pid)
			return nil, false
		}
		if err := os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(strconv.Itoa(pid-1)), 0); err != nil {
			t.Fatalf("set the next pid: %v", err)
		}
		cmd := exec.Command(name, args...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if cmd.Process.Pid == pid {
			t.Cleanup(func() {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
			})
			return cmd, true
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	t.Logf("pid %d not given to a new process in 100 tries", pid)
	return nil, false
}

// KillAndTakePID kills process pid, one the test did not start (its own
// parent reaps it), and starts a long sleep as the next process given that
// pid, as StartWithPID does; false when another task took the pid first.
func KillAndTakePID(t testing.TB, pid int) (*exec.Cmd, bool) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	WaitGone(t, pid)
	return StartWithPID(t, pid, "sleep", "600")
}

// ReusePID runs scenario until StartWithPID, inside it, gets the pid it
// asked for; a few rounds, each with a freed pid of its own, so a race
// lost to another task's fork does not fail the test.
func ReusePID(t testing.TB, scenario func() bool) {
	t.Helper()
	for round := 0; round < 5; round++ {
		if scenario() {
			return
		}
	}
	t.Fatal("every freed pid went to another task first")
}

// WaitGone waits until no process has pid (its parent reaped it).
func WaitGone(t testing.TB, pid int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); syscall.Kill(pid, 0) == nil; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("process %d still there 10s after it was killed", pid)
		}
	}
}

// EndedByKill kills cmd (from StartWithPID) and reports whether that
// SIGKILL is what ended it: false when another signal ended it before.
func EndedByKill(t testing.TB, cmd *exec.Cmd) bool {
	t.Helper()
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Logf("process %d ended: %v", cmd.Process.Pid, cmd.ProcessState)
		return false
	}
	return true
}

// UserNSOwner is the inode of the user namespace that owns the namespace
// at path (NS_GET_USERNS).
func UserNSOwner(t testing.TB, path string) uint64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fd, err := unix.IoctlRetInt(int(f.Fd()), unix.NS_GET_USERNS)
	if err != nil {
		t.Fatalf("NS_GET_USERNS %s: %v", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}
