package containerd

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/containers"

	"github.com/noderun/noderun/runner"
)

// fakeHost sets this boot's ID and the processes that run, for the test.
func fakeHost(t *testing.T, boot string, procs map[uint32]uint64) {
	oldBoot, oldProc := bootID, procStartTime
	bootID = boot
	procStartTime = func(pid uint32) (uint64, bool) { st, ok := procs[pid]; return st, ok }
	t.Cleanup(func() { bootID, procStartTime = oldBoot, oldProc })
}

func TestTasklessRunIsToldApart(t *testing.T) {
	at := time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
	fakeHost(t, "boot-2", map[uint32]uint64{100: 5000, 200: 9999})
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   runner.ContainerState
		code   int
		reason string
	}{
		{name: "created, never started: started again", labels: map[string]string{}, want: runner.StateCreated},
		{name: "recorded exit survives the task", want: runner.StateExited, code: 0,
			labels: map[string]string{LabelStarted: "boot-1 100 5000 x", LabelExit: exitRecord(0, at, "")}},
		{name: "recorded failure survives the task", want: runner.StateExited, code: 7,
			labels: map[string]string{LabelStarted: "boot-2 100 5000 x", LabelExit: exitRecord(7, at, "")}},
		{name: "ran in an earlier boot, exit never seen: lost", want: runner.StateExited, code: 255, reason: "Unknown",
			labels: map[string]string{LabelStarted: "boot-1 100 5000 x"}},
		{name: "this boot, process still there: cannot tell", want: runner.StateUnknown,
			labels: map[string]string{LabelStarted: "boot-2 100 5000 x"}},
		{name: "this boot, process gone: lost", want: runner.StateExited, code: 255, reason: "Unknown",
			labels: map[string]string{LabelStarted: "boot-2 300 5000 x"}},
		{name: "this boot, PID reused by another process: lost", want: runner.StateExited, code: 255, reason: "Unknown",
			labels: map[string]string{LabelStarted: "boot-2 200 5000 x"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := statusOf(&containers.Container{ID: "c", Labels: tc.labels}, nil)
			if st.State != tc.want || st.ExitCode != tc.code || st.Reason != tc.reason {
				t.Fatalf("state %v exit %d reason %q; want %v %d %q", st.State, st.ExitCode, st.Reason, tc.want, tc.code, tc.reason)
			}
			if tc.want == runner.StateExited && tc.labels[LabelExit] != "" && !st.FinishedAt.Equal(at) {
				t.Fatalf("finished %v, want the recorded %v", st.FinishedAt, at)
			}
		})
	}
}

func TestUnknownTaskStateIsUnknown(t *testing.T) {
	st := statusOf(&containers.Container{ID: "c", Labels: map[string]string{LabelStarted: "b 1 1 x"}},
		&tasktypes.Process{Status: tasktypes.Status_UNKNOWN, Pid: 1})
	if st.State != runner.StateUnknown {
		t.Fatalf("state %v, want Unknown (a task state call that timed out)", st.State)
	}
}

// A run's start is what its start record says, not the creation of its
// container record, which a precreated container has seconds before: the
// engine reported the record's time while it watched the start, and a
// restarted noderun must report the same startedAt.
func TestStartedAtIsTheStartRecord(t *testing.T) {
	created := time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
	started := created.Add(1500 * time.Millisecond)
	running := &tasktypes.Process{Status: tasktypes.Status_RUNNING, Pid: 1}
	c := &containers.Container{ID: "c", CreatedAt: created,
		Labels: map[string]string{LabelStarted: startedRecord(1, started)}}
	if st := statusOf(c, running); !st.CreatedAt.Equal(started) {
		t.Errorf("run started %v, want the start record's %v", st.CreatedAt, started)
	}
	c.Labels[LabelStarted] = ""
	if st := statusOf(c, running); !st.CreatedAt.Equal(created) {
		t.Errorf("run with no start record started %v, want the container's creation %v", st.CreatedAt, created)
	}
}

func TestExitToRecord(t *testing.T) {
	at := time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
	now := at.Add(time.Hour)
	stopped := &tasktypes.Process{Status: tasktypes.Status_STOPPED, ExitStatus: 3}
	c := &containers.Container{ID: "c", Labels: map[string]string{}}
	st := runner.ContainerStatus{State: runner.StateExited, ExitCode: 3, FinishedAt: at}
	if got, want := exitToRecord(c, stopped, &st, now), exitRecord(3, at, ""); got != want {
		t.Fatalf("stopped task: record %q, want %q", got, want)
	}
	lost := runner.ContainerStatus{State: runner.StateExited, ExitCode: 255, Reason: "Unknown"}
	if got, want := exitToRecord(c, nil, &lost, now), exitRecord(255, now, "Unknown"); got != want {
		t.Fatalf("lost run: record %q, want %q", got, want)
	}
	c.Labels[LabelExit] = exitRecord(3, at, "")
	if got := exitToRecord(c, stopped, &st, now); got != "" {
		t.Fatalf("already recorded, yet records %q again", got)
	}
	running := runner.ContainerStatus{State: runner.StateRunning}
	if got := exitToRecord(&containers.Container{Labels: map[string]string{}}, nil, &running, now); got != "" {
		t.Fatalf("running run: records %q", got)
	}
}

func TestProcStartTimeOfThisProcess(t *testing.T) {
	a, ok := readProcStartTime(uint32(os.Getpid()))
	if !ok || a == 0 {
		t.Fatalf("start time of this process: %d, %v", a, ok)
	}
	if _, ok := readProcStartTime(1 << 30); ok {
		t.Fatal("a PID that cannot exist has a start time")
	}
}

// A process containerd lost the task of is killed through its start
// record, and only if it is the same process (PID and start time).
func TestKillLostProcess(t *testing.T) {
	spawn := func() *exec.Cmd {
		cmd := exec.Command("sleep", "100")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd
	}
	other := spawn()
	pid := uint32(other.Process.Pid)
	st, _ := procStartTime(pid)
	wrong := map[string]string{LabelStarted: fmt.Sprintf("%s %d %d x", bootID, pid, st+1)}
	if err := killLostProcess(context.Background(), wrong); err != nil {
		t.Fatal(err)
	}
	if _, alive := procStartTime(pid); !alive {
		t.Fatal("a process with the same PID but another start time was killed")
	}
	if err := killLostProcess(context.Background(), map[string]string{LabelStarted: startedRecord(pid, time.Now())}); err != nil {
		t.Fatal(err)
	}
	if err := other.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("the lost process ended with %v, want killed", err)
	}
}
