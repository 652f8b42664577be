// Package testnode starts and watches "a noderun under test" for the
// end-to-end tests (e2e) and the benchmark (bench): its prerequisites and
// build, a private containerd, the noderun process with its flags, its
// status API, and the host state (mounts, processes) both check and clean.
// It is not a _test package because bench is a program (`go run ./bench`)
// and cannot import test files; it reports errors instead of failing a
// testing.T so that both may use it.
package testnode

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"time"
)

// Process is a running noderun (or any child meant to die with its parent).
// The embedded Cmd gives its PID, Path, Env and, once it has exited,
// ProcessState.
type Process struct {
	*exec.Cmd
	done chan struct{} // closed once the process has exited
}

// Start runs cmd with its output appended to (or, with truncate, written
// over) the file out. Should the caller die without cleanup, the process
// gets SIGKILL.
func Start(cmd *exec.Cmd, out string, truncate bool) (*Process, error) {
	mode := os.O_CREATE | os.O_WRONLY | os.O_APPEND
	if truncate {
		mode = os.O_CREATE | os.O_WRONLY | os.O_TRUNC
	}
	f, err := os.OpenFile(out, mode, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close() // the child has its own copy
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p := &Process{Cmd: cmd, done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		// Pdeathsig fires when the forking thread exits, and callers end
		// threads (cni.CreateNamespaces discards the one it unshares on).
		// This thread stays locked, and alive, until the process exits.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = cmd.Wait()
		close(p.done)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return p, nil
}

// Running reports whether the process has not exited yet.
func (p *Process) Running() bool {
	if p == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Stop sends SIGTERM and waits up to timeout for the process to exit, then
// kills it; it reports whether SIGTERM alone ended it.
func (p *Process) Stop(timeout time.Duration) bool {
	if !p.Running() {
		return true
	}
	_ = p.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return true
	case <-time.After(timeout):
		_ = p.Process.Kill()
		<-p.done
		return false
	}
}

// Kill9 kills the process the hard way, as a crash would, and waits for it.
func (p *Process) Kill9() error {
	if err := p.Process.Signal(syscall.SIGKILL); err != nil {
		return err
	}
	<-p.done
	return nil
}

// WaitHealthy polls the status API's /healthz every `every` until it
// answers, the process exits, timeout passes or ctx ends.
func WaitHealthy(ctx context.Context, p *Process, c *StatusClient, timeout, every time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if !p.Running() {
			return fmt.Errorf("noderun exited during start: %v", p.ProcessState)
		}
		_, _, err := c.Fetch(ctx, "/healthz")
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("noderun not healthy after %s: %w", timeout, err)
		}
		select {
		case <-time.After(every):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
