package containerd

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"sync"
	"time"

	ctrd "github.com/containerd/containerd"
	"github.com/containerd/containerd/cio"
	"github.com/containerd/containerd/errdefs"
	"github.com/noderun/noderun/internal/execio"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// firstSizeWait bounds the wait for a terminal's first size, which
// clients send as soon as the exec's streams are open.
const firstSizeWait = time.Second

// Exec runs cmd in the running container id with the streams of s, as
// containerd's CRI Exec does for kubectl exec: the container's process
// spec (user, env, cwd, capabilities, ...) with other args, a terminal
// when asked for. It returns the command's exit status once it ended and
// its output was written. When ctx ends (the client went away) the
// command is killed.
func (r *Runtime) Exec(ctx context.Context, id string, cmd []string, s execio.ExecIO) (int, error) {
	ctx = r.ctx(ctx)
	task, spec, err := r.runningTask(ctx, id)
	if err != nil {
		return 0, err
	}
	spec.Args, spec.Terminal, spec.CommandLine = cmd, s.TTY, ""
	if err := firstSize(ctx, spec, s); err != nil {
		return 0, err
	}
	execID := "exec-" + rand.Text()
	dio, copies, err := r.execIO(id, execID, s)
	if err != nil {
		return 0, err
	}
	proc, err := task.Exec(ctx, execID, spec, func(string) (cio.IO, error) { return dio, nil })
	if err != nil {
		return 0, fmt.Errorf("exec in %s: %w", id, err) // task.Exec closed dio
	}
	defer r.deleteExec(proc, id) // kills it if it still runs
	waitCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Wait before Start, or a quick exit could be missed.
	exited, err := proc.Wait(waitCtx)
	if err != nil {
		return 0, fmt.Errorf("exec in %s: wait: %w", id, err)
	}
	if err := proc.Start(ctx); err != nil {
		return 0, fmt.Errorf("exec in %s: start: %w", id, err)
	}
	if dio.Stdin != nil {
		go r.feedStdin(ctx, proc, dio, s.Stdin, id, execID)
	}
	if s.Resize != nil {
		go resizeExec(waitCtx, proc, s.Resize)
	}
	select {
	case st := <-exited:
		code, _, err := st.Result()
		if err != nil {
			return 0, fmt.Errorf("exec in %s: wait: %w", id, err)
		}
		// Output still in the pipes goes out before the status; a child
		// left holding them is not waited for past execDrainTimeout.
		ioDone(ctx, copies.Wait, execDrainTimeout)
		return int(code), nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// firstSize sets spec's console size to the client's first terminal size
// when s asks for a terminal that resizes.
func firstSize(ctx context.Context, spec *specs.Process, s execio.ExecIO) error {
	if !s.TTY || s.Resize == nil {
		return nil
	}
	// The terminal gets the client's size from the start: a command
	// that asks for it at once (stty size, a full-screen program)
	// would otherwise find 0x0.
	select {
	case sz, ok := <-s.Resize:
		if ok {
			spec.ConsoleSize = &specs.Box{Height: uint(sz.Height), Width: uint(sz.Width)}
		}
	case <-time.After(firstSizeWait):
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// execIO makes the FIFOs of exec execID in container id and starts copying
// its output to s; copies ends once that output did.
func (r *Runtime) execIO(id, execID string, s execio.ExecIO) (dio *cio.DirectIO, copies *sync.WaitGroup, err error) {
	fifos, err := cio.NewFIFOSetInDir(r.fifoDir, execID, s.TTY)
	if err != nil {
		return nil, nil, fmt.Errorf("exec in %s: %w", id, err)
	}
	if s.Stdin == nil {
		fifos.Stdin = ""
	}
	// The FIFOs are copied here rather than by cio's own copies, whose
	// stdin copy takes the client's bytes before its FIFO has a reader and
	// says nothing once they are in it: telling the shim that stdin ended
	// could then overtake them, and the command lost its input or never
	// saw its end. Closed when the exec is deleted, not with ctx.
	dio, err = cio.NewDirectIO(context.Background(), fifos)
	if err != nil {
		return nil, nil, fmt.Errorf("exec in %s: %w", id, err)
	}
	copies = &sync.WaitGroup{}
	for _, c := range []struct {
		w io.Writer
		r io.Reader
	}{{s.Stdout, dio.Stdout}, {s.Stderr, dio.Stderr}} {
		if c.r == nil {
			continue // stderr with a terminal
		}
		copies.Add(1)
		go func() {
			defer copies.Done()
			io.Copy(orDiscard(c.w), c.r)
		}()
	}
	return dio, copies, nil
}

// feedStdin copies the client's stdin to the exec's, then closes it.
func (r *Runtime) feedStdin(ctx context.Context, proc ctrd.Process, dio *cio.DirectIO, stdin io.Reader, id, execID string) {
	// A write returns once the shim reads the FIFO; the empty
	// one waits for that when the client sent nothing. Only then
	// may the shim drop its own end (CloseIO), which otherwise
	// keeps the command's stdin open.
	if _, err := io.Copy(dio.Stdin, stdin); err == nil {
		dio.Stdin.Write(nil)
	}
	dio.Stdin.Close()
	if err := proc.CloseIO(ctx, ctrd.WithStdinCloser); err != nil && !errdefs.IsNotFound(err) && ctx.Err() == nil {
		r.log.Warn("close exec stdin", "container", id, "exec", execID, "err", err)
	}
}

// resizeExec passes the client's terminal sizes to the exec's terminal.
func resizeExec(ctx context.Context, proc ctrd.Process, sizes <-chan execio.TerminalSize) {
	for {
		select {
		case <-ctx.Done():
			return
		case sz, ok := <-sizes:
			if !ok {
				return
			}
			// A resize racing the command's end fails; nothing to do.
			_ = proc.Resize(ctx, uint32(sz.Width), uint32(sz.Height))
		}
	}
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}
