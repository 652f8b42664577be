package containerd

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/noderun/noderun/runner"
)

// A run's task is only evidence while it exists: tasks do not survive a
// reboot, a dead shim or a daemon that lost them. So each run records on
// its container that it started (which process, in which boot) and, once
// seen, how it ended. A run whose task is gone is then told apart:
// never started (start it), ended (its recorded exit), or lost (ran, but
// its exit was never seen: exit code 255, reason Unknown, as CRI reports a
// lost exit). Only while its process might still run is it Unknown.

// Values of the reason field of LabelExit.
const lostExitReason = "Unknown"

// lostExitCode is what CRI runtimes report for a run whose exit was lost.
const lostExitCode = 255

// host facts that decide whether a recorded process still runs; tests
// replace them.
var (
	bootID        = readBootID()
	procStartTime = readProcStartTime
)

// readBootID names this boot; "-" when the kernel does not say, and then
// only the process check tells runs apart.
func readBootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if id := strings.TrimSpace(string(b)); err == nil && id != "" {
		return id
	}
	return "-"
}

// readProcStartTime returns a process's start time in clock ticks since
// boot (field 22 of /proc/<pid>/stat), which tells it from a later process
// given the same PID.
func readProcStartTime(pid uint32) (uint64, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	// The command name (field 2) may hold spaces and parentheses: the
	// fields that follow start after its last ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, false
	}
	t, err := strconv.ParseUint(f[19], 10, 64)
	return t, err == nil
}

// procID names one process across PID reuse and reboots, as
// "<boot id> <pid> <pid start time>": a run's start record and a lease's
// owner.
type procID struct {
	boot  string
	pid   uint32
	start uint64 // 0: not readable, the process had already ended
}

func procIDOf(pid uint32) procID {
	st, _ := procStartTime(pid)
	return procID{bootID, pid, st}
}

func (p procID) String() string { return fmt.Sprintf("%s %d %d", p.boot, p.pid, p.start) }

// parseProcID reads the first three fields of s as a procID.
func parseProcID(s string) (procID, bool) {
	var p procID
	_, err := fmt.Sscanf(s, "%s %d %d", &p.boot, &p.pid, &p.start)
	return p, err == nil
}

// alive reports whether the process still runs: this boot, and a process
// with its PID and start time.
func (p procID) alive() bool {
	if p.boot != bootID || p.start == 0 {
		return false // every process of another boot is gone
	}
	got, ok := procStartTime(p.pid)
	return ok && got == p.start
}

// startedRecord is LabelStarted's value for a task just started.
func startedRecord(pid uint32, at time.Time) string {
	return procIDOf(pid).String() + " " + at.UTC().Format(time.RFC3339Nano)
}

// startedAt is when c's run started, as its start record says (what the
// engine reported while it watched the start), or when the container was
// created for a run with no readable record.
func startedAt(c *containers.Container) time.Time {
	f := strings.Fields(c.Labels[LabelStarted])
	if len(f) == 4 {
		if at, err := time.Parse(time.RFC3339Nano, f[3]); err == nil {
			return at
		}
	}
	return c.CreatedAt
}

// exitRecord is LabelExit's value.
func exitRecord(code int, at time.Time, reason string) string {
	s := fmt.Sprintf("%d %s", code, at.UTC().Format(time.RFC3339Nano))
	if reason != "" {
		s += " " + reason
	}
	return s
}

// recordedExit reads LabelExit.
func recordedExit(l map[string]string) (code int, at time.Time, reason string, ok bool) {
	f := strings.Fields(l[LabelExit])
	if len(f) < 2 {
		return 0, time.Time{}, "", false
	}
	code, err := strconv.Atoi(f[0])
	if err != nil {
		return 0, time.Time{}, "", false
	}
	at, _ = time.Parse(time.RFC3339Nano, f[1])
	if len(f) > 2 {
		reason = f[2]
	}
	return code, at, reason, true
}

// mayStillRun reads LabelStarted: whether the run's process could still
// be running (same boot, a process with its PID and start time exists),
// and whether the run started at all.
func mayStillRun(l map[string]string) (started, alive bool) {
	if l[LabelStarted] == "" {
		return false, false
	}
	p, ok := parseProcID(l[LabelStarted])
	return true, !ok || p.alive() // unreadable: cannot tell
}

// killLostProcess SIGKILLs a run's process that lives on although
// containerd lost its task, and waits for it to end: it is found by the
// PID and start time its start record holds, through a pidfd, so a later
// process given the same PID is never hit.
func killLostProcess(ctx context.Context, labels map[string]string) error {
	p, ok := parseProcID(labels[LabelStarted])
	if !ok || !p.alive() {
		return nil // never started, or nothing of it runs
	}
	pid := p.pid
	fd, err := unix.PidfdOpen(int(pid), 0)
	if err != nil {
		return nil // gone
	}
	defer unix.Close(fd)
	// Checked again once the pidfd pins the process: before, the PID
	// could have been given to another one.
	if !p.alive() {
		return nil
	}
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && err != unix.ESRCH {
		return fmt.Errorf("kill lost process %d: %w", pid, err)
	}
	// The pidfd turns readable when the process has ended.
	for {
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 100)
		if n > 0 || (err != nil && err != unix.EINTR) {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("lost process %d not ended after SIGKILL: %w", pid, ctx.Err())
		}
	}
}

// taskless is the state of a run whose task containerd does not report.
func taskless(st *runner.ContainerStatus, l map[string]string) {
	if code, at, reason, ok := recordedExit(l); ok {
		st.State, st.ExitCode, st.FinishedAt, st.Reason = runner.StateExited, code, at, reason
		return
	}
	switch started, alive := mayStillRun(l); {
	case !started:
		st.State = runner.StateCreated
	case alive:
		st.State = runner.StateUnknown // a stalled shim, a daemon restarting
	default:
		st.State, st.ExitCode, st.Reason = runner.StateExited, lostExitCode, lostExitReason
	}
}

// exitToRecord is the LabelExit value to write for a run just seen ended
// and not yet recorded, or "". A lost run is given now as its finish time,
// recorded so it keeps it.
func exitToRecord(c *containers.Container, p *tasktypes.Process, st *runner.ContainerStatus, now time.Time) string {
	if st.State != runner.StateExited || c.Labels[LabelExit] != "" {
		return ""
	}
	if p == nil {
		st.FinishedAt = now
		return exitRecord(st.ExitCode, now, st.Reason)
	}
	return exitRecord(st.ExitCode, st.FinishedAt, "")
}

// setLabel writes one label on one of our containers.
func (r *Runtime) setLabel(ctx context.Context, id, key, value string) error {
	upd := containers.Container{ID: id, Labels: map[string]string{key: value}}
	if _, err := r.client.ContainerService().Update(ctx, upd, "labels."+key); err != nil && !errdefs.IsNotFound(err) {
		return err
	}
	return nil
}
