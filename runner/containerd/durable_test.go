package containerd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	ctrd "github.com/containerd/containerd"
	"github.com/containerd/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/noderun/noderun/internal/testenv"
	"github.com/noderun/noderun/runner"
)

// loseTask deletes a container's task behind the runtime's back, as a
// reboot or a lost shim does: the container record stays.
func loseTask(t *testing.T, rt *Runtime, id string) {
	t.Helper()
	task := loadTask(t, rt, id)
	if _, err := task.Delete(rt.ctx(context.Background()), ctrd.WithProcessKill); err != nil {
		t.Fatal(err)
	}
}

func TestExitOutlivesTheTask(t *testing.T) {
	rt := testRuntime(t)
	cfg := testConfig(t, rt, "job", "sh", "-c", "exit 3")
	startContainer(t, rt, cfg)
	first := waitExited(t, rt, cfg) // seen ended: recorded
	loseTask(t, rt, cfg.ID)
	st := containerStatus(t, rt, cfg)
	if st.State != runner.StateExited || st.ExitCode != 3 || !st.FinishedAt.Equal(first.FinishedAt) {
		t.Fatalf("after the task is gone: state %v exit %d finished %v; want exited 3 at %v",
			st.State, st.ExitCode, st.FinishedAt, first.FinishedAt)
	}
}

func TestRunWhoseExitWasNeverSeenIsLost(t *testing.T) {
	rt := testRuntime(t)
	cfg := testConfig(t, rt, "lost", "sleep", "3600")
	startContainer(t, rt, cfg)
	if st := containerStatus(t, rt, cfg); st.State != runner.StateRunning {
		t.Fatalf("state %v, want running", st.State)
	}
	loseTask(t, rt, cfg.ID) // killed with it, and nobody listed it ended
	st := containerStatus(t, rt, cfg)
	if st.State != runner.StateExited || st.ExitCode != 255 || st.Reason != "Unknown" {
		t.Fatalf("state %v exit %d reason %q; want exited 255 Unknown (CRI's lost exit), not created", st.State, st.ExitCode, st.Reason)
	}
	again := containerStatus(t, rt, cfg)
	if !again.FinishedAt.Equal(st.FinishedAt) || again.FinishedAt.IsZero() {
		t.Fatalf("finish time %v then %v; want one recorded time", st.FinishedAt, again.FinishedAt)
	}
}

// A shim that does not answer (stopped here; stalled under memory
// pressure in life) makes containerd report the task's state as unknown:
// the runtime says so rather than guessing, and the process lives on.
func TestStalledShimIsUnknown(t *testing.T) {
	rt := testRuntime(t)
	cfg := testConfig(t, rt, "stalled", "sleep", "3600")
	startContainer(t, rt, cfg)
	st := containerStatus(t, rt, cfg)
	shim := testenv.ParentPID(t, int(st.PID))
	testenv.Stop(t, shim)
	if got := containerStatus(t, rt, cfg); got.State != runner.StateUnknown {
		t.Fatalf("with its shim stopped: state %v, want unknown", got.State)
	}
	syscall.Kill(shim, syscall.SIGCONT)
	if got := containerStatus(t, rt, cfg); got.State != runner.StateRunning || got.PID != st.PID {
		t.Fatalf("after the shim resumed: state %v pid %d; want running %d", got.State, got.PID, st.PID)
	}
}

// noderun killed between preparing a container's snapshot and creating
// its record leaves the snapshot: the next start of that ID removes it
// rather than failing on "already exists" until containerd's GC runs.
func TestStartReplacesASnapshotLeftByAnInterruptedCreate(t *testing.T) {
	rt := testRuntime(t)
	cfg := testConfig(t, rt, "interrupted", "sleep", "3600")
	ctx := rt.ctx(context.Background())
	facts, _ := rt.imageFacts(digestOf(cfg.Image.ID))
	if _, err := rt.client.SnapshotService(rt.snapshotter).Prepare(ctx, cfg.ID, facts.chainID); err != nil {
		t.Fatal(err)
	}
	startContainer(t, rt, cfg)
	if st := containerStatus(t, rt, cfg); st.State != runner.StateRunning {
		t.Fatalf("state %v, want running", st.State)
	}
	if err := rt.RemoveContainer(context.Background(), cfg.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.client.SnapshotService(rt.snapshotter).Stat(ctx, cfg.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("snapshot after removal: %v, want not found", err)
	}
}

// A container's record is made before ready is asked, its task only once
// ready returned nil; an error from ready leaves neither record nor
// snapshot.
func TestCreateContainerWaitsForReady(t *testing.T) {
	testenv.SkipIfEmulated(t, shimRunsTestBinary)
	rt := testRuntime(t)
	ctx := rt.ctx(context.Background())
	for _, fail := range []bool{false, true} {
		cfg := testConfig(t, rt, fmt.Sprintf("ready-%v", fail), "sleep", "3600")
		asked, answer := make(chan struct{}), make(chan error)
		type result struct {
			c   runner.CreatedContainer
			err error
		}
		done := make(chan result, 1)
		go func() {
			c, err := rt.CreateContainer(context.Background(), cfg, func() error {
				close(asked)
				return <-answer
			})
			done <- result{c, err}
		}()
		<-asked
		c, err := rt.client.LoadContainer(ctx, cfg.ID)
		if err != nil {
			t.Fatalf("no record while ready is asked: %v", err)
		}
		if _, err := c.Task(ctx, nil); !errdefs.IsNotFound(err) {
			t.Fatalf("task before ready returned: %v, want not found", err)
		}
		if fail {
			answer <- errors.New("namespaces not pinned")
			if r := <-done; r.err == nil || !strings.Contains(r.err.Error(), "namespaces not pinned") {
				t.Fatalf("created %v, err %v; want ready's error", r.c, r.err)
			}
			if _, err := rt.client.LoadContainer(ctx, cfg.ID); !errdefs.IsNotFound(err) {
				t.Errorf("record after a failed ready: %v, want not found", err)
			}
			if _, err := rt.client.SnapshotService(rt.snapshotter).Stat(ctx, cfg.ID); !errdefs.IsNotFound(err) {
				t.Errorf("snapshot after a failed ready: %v, want not found", err)
			}
			continue
		}
		answer <- nil
		r := <-done
		if r.err != nil {
			t.Fatal(r.err)
		}
		t.Cleanup(func() {
			if err := rt.RemoveContainer(context.Background(), cfg.ID); err != nil {
				t.Error(err)
			}
		})
		if _, err := r.c.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		if st := containerStatus(t, rt, cfg); st.State != runner.StateRunning {
			t.Fatalf("state %v, want running", st.State)
		}
	}
}

// A stop whose shim does not answer ends after the grace period and the
// slack, with an error, rather than holding the pod's worker for good.
func TestStopIsBoundedWhenTheShimHangs(t *testing.T) {
	rt := testRuntime(t)
	cfg := testConfig(t, rt, "hung", "sleep", "3600")
	startContainer(t, rt, cfg)
	shim := testenv.ParentPID(t, int(containerStatus(t, rt, cfg).PID))
	testenv.Stop(t, shim)
	old := stopSlack
	stopSlack = 3 * time.Second
	defer func() { stopSlack = old }()
	began := time.Now()
	err := rt.StopContainer(context.Background(), cfg.ID, time.Second)
	took := time.Since(began)
	if err == nil || took > 20*time.Second { // not stuck with the shim; generous for a busy machine
		t.Fatalf("stop returned %v after %v; want an error within grace 1s + slack 3s", err, took)
	}
	t.Logf("stop gave up after %v: %v", took.Round(time.Millisecond), err)
}

func TestForgetImageDropsItsUsers(t *testing.T) {
	r := &Runtime{images: map[string]imageFacts{"sha256:a": {}, "sha256:b": {}}, users: map[string]specs.User{
		"docker.io/x@sha256:a|0|<nil>|[]|false": {}, "docker.io/y@sha256:b|0|<nil>|[]|false": {}}}
	r.forgetImage("sha256:a")
	if _, ok := r.images["sha256:a"]; ok || len(r.images) != 1 {
		t.Fatalf("images %v, want only b's", r.images)
	}
	if len(r.users) != 1 {
		t.Fatalf("users %v, want only b's", r.users)
	}
}

// A run started without its start recorded (noderun killed right after
// task.Start, or started by an older noderun) gets the record when it is
// next listed, so its exit stays durable.
func TestStartRecordedWhenMissing(t *testing.T) {
	rt := testRuntime(t)
	cfg := testConfig(t, rt, "unrecorded", "sleep", "3600")
	startContainer(t, rt, cfg)
	if err := rt.setLabel(rt.ctx(context.Background()), cfg.ID, LabelStarted, ""); err != nil {
		t.Fatal(err)
	}
	containerStatus(t, rt, cfg) // listed: recorded again
	loseTask(t, rt, cfg.ID)
	if st := containerStatus(t, rt, cfg); st.State != runner.StateExited || st.ExitCode != 255 {
		t.Fatalf("state %v exit %d; want a lost run (exited 255), not one never started", st.State, st.ExitCode)
	}
}

// The start's record names the container's process (the pid the task
// service's start answered), which a lost task's cleanup kills.
func TestStartRecordsTheProcess(t *testing.T) {
	rt := testRuntime(t)
	cfg := testConfig(t, rt, "recorded", "sleep", "3600")
	startContainer(t, rt, cfg)
	ctx := rt.ctx(context.Background())
	c, err := rt.client.LoadContainer(ctx, cfg.ID)
	if err != nil {
		t.Fatal(err)
	}
	labels, err := c.Labels(ctx)
	if err != nil {
		t.Fatal(err)
	}
	task, err := c.Task(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	p, ok := parseProcID(labels[LabelStarted])
	if !ok || p.pid != task.Pid() || !p.alive() {
		t.Fatalf("start recorded as %q; want the running task's pid %d", labels[LabelStarted], task.Pid())
	}
}
