package containerd

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"sync"
	"syscall"
	"time"

	ctrd "github.com/containerd/containerd"
	"github.com/containerd/containerd/cio"
	"github.com/containerd/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/noderun/noderun/runner"
)

const (
	// execOutputCap bounds each of an exec's stdout and stderr: probes and
	// hooks only need the start of what a command says.
	execOutputCap = 16 << 10
	// execDrainTimeout bounds the wait for an ended exec's output: a child
	// it left in the background may hold the pipes open forever (CRI's
	// drain_exec_sync_io_timeout).
	execDrainTimeout = time.Second
	// execKillWait bounds the wait for an exec to die after SIGKILL, for
	// a process stuck in the kernel.
	execKillWait = 3 * time.Second
	// execCleanupTimeout bounds removing the exec from the shim, which
	// itself waits up to 10 s for output a child still holds.
	execCleanupTimeout = 30 * time.Second
)

// ExecSync runs cmd in the container's task as containerd's CRI ExecSync
// does: the container's process spec (user, env, cwd, capabilities, ...)
// with other args and no terminal, output captured in memory through FIFOs
// under the runtime's own directory, the exec process always deleted.
// Deleting waits in the shim for the exec's output to end, so it is left
// to the background when a child the command started still holds that
// output, or the exec still runs because ctx ended.
func (r *Runtime) ExecSync(ctx context.Context, id string, cmd []string, timeout time.Duration) (runner.ExecResult, error) {
	ctx = r.ctx(ctx)
	task, spec, err := r.runningTask(ctx, id)
	if err != nil {
		return runner.ExecResult{}, err
	}
	spec.Args, spec.Terminal, spec.CommandLine = cmd, false, ""
	stdout, stderr := &cappedBuffer{limit: execOutputCap}, &cappedBuffer{limit: execOutputCap}
	execID := "exec-" + rand.Text()
	proc, err := task.Exec(ctx, execID, spec,
		cio.NewCreator(cio.WithStreams(nil, stdout, stderr), cio.WithFIFODir(r.fifoDir)))
	if err != nil {
		return runner.ExecResult{}, fmt.Errorf("exec in %s: %w", id, err)
	}
	res, err := r.runExec(ctx, proc, timeout)
	if ioDone(ctx, proc.IO().Wait, execDrainTimeout) {
		r.deleteExec(proc, id)
	} else {
		go r.deleteExec(proc, id)
	}
	res.Output = append(stdout.Bytes(), stderr.Bytes()...)
	if err != nil {
		return res, fmt.Errorf("exec in %s: %w", id, err)
	}
	return res, nil
}

// runningTask is the container's task and process spec, if it runs.
func (r *Runtime) runningTask(ctx context.Context, id string) (ctrd.Task, *specs.Process, error) {
	c, err := r.client.LoadContainer(ctx, id)
	if err != nil {
		return nil, nil, fmt.Errorf("exec in %s: %w", id, err)
	}
	spec, err := c.Spec(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("exec in %s: spec: %w", id, err)
	}
	if spec.Process == nil {
		return nil, nil, fmt.Errorf("exec in %s: spec has no process: %w", id, errdefs.ErrFailedPrecondition)
	}
	task, err := c.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		return nil, nil, fmt.Errorf("exec in %s: container has no task: %w", id, errdefs.ErrFailedPrecondition)
	} else if err != nil {
		return nil, nil, fmt.Errorf("exec in %s: load task: %w", id, err)
	}
	st, err := task.Status(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("exec in %s: task status: %w", id, err)
	}
	if st.Status != ctrd.Running {
		return nil, nil, fmt.Errorf("exec in %s: container is %s, not running: %w", id, st.Status, errdefs.ErrFailedPrecondition)
	}
	return task, spec.Process, nil
}

// runExec starts proc and waits for it, killing it at the timeout or when
// ctx ends.
func (r *Runtime) runExec(ctx context.Context, proc ctrd.Process, timeout time.Duration) (runner.ExecResult, error) {
	waitCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Wait before Start, or a quick exit could be missed.
	exited, err := proc.Wait(waitCtx)
	if err != nil {
		return runner.ExecResult{}, fmt.Errorf("wait: %w", err)
	}
	if err := proc.Start(ctx); err != nil {
		return runner.ExecResult{}, fmt.Errorf("start: %w", err)
	}
	var deadline <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		deadline = t.C
	}
	select {
	case st := <-exited:
		code, _, err := st.Result()
		if err != nil {
			return runner.ExecResult{}, fmt.Errorf("wait: %w", err)
		}
		return runner.ExecResult{ExitCode: int(code)}, nil
	case <-deadline:
		return runner.ExecResult{ExitCode: killExec(ctx, proc, exited), TimedOut: true}, nil
	case <-ctx.Done():
		return runner.ExecResult{}, ctx.Err() // deleteExec kills it
	}
}

// killExec SIGKILLs a timed-out exec and returns its exit status, or -1
// when it did not die within execKillWait. Only the exec's own process is
// killed, as under CRI: children it started stay in the container.
func killExec(ctx context.Context, proc ctrd.Process, exited <-chan ctrd.ExitStatus) int {
	if err := proc.Kill(ctx, syscall.SIGKILL); err != nil && !errdefs.IsNotFound(err) {
		return -1
	}
	t := time.NewTimer(execKillWait)
	defer t.Stop()
	select {
	case st := <-exited:
		if code, _, err := st.Result(); err == nil {
			return int(code)
		}
	case <-t.C:
	case <-ctx.Done():
	}
	return -1
}

// ioDone waits, at most d, for the exec's output to end: its process and
// every child holding its stdout and stderr have gone.
func ioDone(ctx context.Context, wait func(), d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		wait() // returns at the latest when deleteExec closes the io
		close(done)
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

// deleteExec removes the exec from the shim, killing it if it still runs.
// Delete also ends our copies and removes the FIFOs; when it fails we do
// that ourselves, so no FIFO is left behind.
func (r *Runtime) deleteExec(proc ctrd.Process, containerID string) {
	ctx, cancel := context.WithTimeout(r.ctx(context.Background()), execCleanupTimeout)
	defer cancel()
	if _, err := proc.Delete(ctx, ctrd.WithProcessKill); err != nil {
		if !errdefs.IsNotFound(err) {
			r.log.Warn("delete exec process", "container", containerID, "exec", proc.ID(), "err", err)
		}
		pio := proc.IO()
		pio.Cancel()
		pio.Wait()
		pio.Close()
	}
}

// cappedBuffer keeps the first limit bytes written to it and discards the
// rest, never failing the writer (which would stall the exec's pipe).
type cappedBuffer struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	limit int
}

func (b *cappedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.limit - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// Bytes returns a copy of what was kept.
func (b *cappedBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.buf.Bytes())
}
