package containerd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	ctrd "github.com/containerd/containerd"
	"github.com/containerd/containerd/cio"
	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/noderun/noderun/crilog"
	"github.com/noderun/noderun/internal/execio"
	"github.com/noderun/noderun/runner"
)

// A container's stdin and terminal, as containerd's CRI plugin gives them
// for the kubelet's stdin, stdinOnce and tty:
//
//   - tty: runc makes a terminal and the shim copies it to the log driver's
//     stdout pipe, so a tty container's output is all stdout (the shim's
//     binary log driver path with Terminal; CRI's FIFO path does the same);
//   - stdin: a FIFO the shim reads into the process's stdin (or its
//     terminal). The shim holds a write end of its own until CloseIO, so
//     the process's stdin stays open, reading nothing, while nobody
//     attaches, across noderun restarts too; an attach writes to the FIFO.
//   - stdin without tty: the shim passes stdin only along with FIFOs for
//     the output (its binary log driver path has no stdin), so noderun
//     opens their read ends and runs the log driver on them itself, as the
//     shim would have: the collector then takes them like any other.

// stdioDir holds the FIFOs of container id's task.
func (r *Runtime) stdioDir(id string) string { return filepath.Join(r.stdioRoot, id) }

// stdinFIFO is the FIFO an attach writes to the container's stdin through.
func (r *Runtime) stdinFIFO(id string) string { return filepath.Join(r.stdioDir(id), "stdin") }

// withTerminal gives the process a terminal, and TERM=xterm unless its
// environment (the image's or the container's) sets TERM, as CRI's
// oci.WithTTY does before the environment is applied.
func withTerminal(tty bool) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if !tty {
			return nil
		}
		if s.Process == nil {
			s.Process = &specs.Process{}
		}
		s.Process.Terminal = true
		if !slices.ContainsFunc(s.Process.Env, func(e string) bool { return strings.HasPrefix(e, "TERM=") }) {
			s.Process.Env = append(s.Process.Env, "TERM=xterm")
		}
		return nil
	}
}

// taskStdio is the stdio of cfg's task: the log driver's URI for the
// output and, for a container with stdin, the FIFOs described above.
// With stdin and no terminal, output is a pair of FIFOs whose read ends
// wait in outputs until the shim opened them (see runDriver).
func (r *Runtime) taskStdio(cfg *runner.ContainerConfig) (cio.Config, *fifoOutputs, error) {
	target := crilog.Target{Path: cfg.LogPath, Rotation: r.logRotation, Collector: r.logCollector, Root: r.podLogDir}
	uri := crilog.URI(r.logDriver, target)
	c := cfg.Container
	sc := cio.Config{Terminal: c.TTY, Stdout: uri, Stderr: uri}
	if !c.Stdin {
		return sc, nil, nil
	}
	dir := r.stdioDir(cfg.ID)
	if err := os.RemoveAll(dir); err != nil { // a crashed create's
		return sc, nil, fmt.Errorf("stdio of %s: %w", cfg.ID, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return sc, nil, fmt.Errorf("stdio of %s: %w", cfg.ID, err)
	}
	sc.Stdin = r.stdinFIFO(cfg.ID)
	names := []string{sc.Stdin}
	if !c.TTY {
		sc.Stdout, sc.Stderr = filepath.Join(dir, "stdout"), filepath.Join(dir, "stderr")
		names = append(names, sc.Stdout, sc.Stderr)
	}
	for _, n := range names {
		if err := unix.Mkfifo(n, 0o600); err != nil {
			return sc, nil, fmt.Errorf("stdio of %s: %w", cfg.ID, err)
		}
	}
	if c.TTY {
		return sc, nil, nil
	}
	return sc, openOutputs(sc.Stdout, sc.Stderr, target), nil
}

// fifoOutputs are the read ends of a task's output FIFOs, opened in the
// background: opening a FIFO for reading waits for its writer (the shim,
// while it creates the task), and one opened without waiting would read
// EOF before the shim ever wrote.
type fifoOutputs struct {
	paths  [2]string
	target crilog.Target
	opened chan openedFIFO
}

type openedFIFO struct {
	i   int
	f   *os.File
	err error
}

func openOutputs(stdout, stderr string, t crilog.Target) *fifoOutputs {
	o := &fifoOutputs{paths: [2]string{stdout, stderr}, target: t, opened: make(chan openedFIFO, 2)}
	for i, p := range o.paths {
		go func() {
			f, err := os.OpenFile(p, os.O_RDONLY, 0)
			o.opened <- openedFIFO{i, f, err}
		}()
	}
	return o
}

// wait returns the read ends once their opens are done. Without created,
// or once driverReadyWait passed without the shim's opening them, it
// opens each FIFO for reading and writing, which never waits, until the
// opens are done, so that none is left waiting.
func (o *fifoOutputs) wait(created bool) (files [2]*os.File, err error) {
	var holds []*os.File
	defer func() {
		for _, h := range holds {
			h.Close()
		}
	}()
	hold := func() {
		for _, p := range o.paths {
			if h, err := os.OpenFile(p, os.O_RDWR, 0); err == nil {
				holds = append(holds, h)
			}
		}
	}
	if !created {
		hold()
	}
	timeout := time.NewTimer(driverReadyWait)
	defer timeout.Stop()
	var errs []error
	for got := 0; got < len(o.paths); {
		select {
		case op := <-o.opened:
			files[op.i] = op.f
			errs = append(errs, op.err)
			got++
		case <-timeout.C:
			hold()
			errs = append(errs, fmt.Errorf("output FIFOs: the shim did not open them in %s", driverReadyWait))
		}
	}
	return files, errors.Join(errs...)
}

// driverReadyWait bounds the wait for the shim's opening of the output
// FIFOs and for the log driver's ready signal.
const driverReadyWait = 30 * time.Second

// runDriver runs the log driver on the output FIFOs once the shim opened
// them, as the shim runs it on its pipes: `<driver> log-driver <target>`
// with stdout on fd 3, stderr on fd 4 and the ready pipe on fd 5, in a
// session of its own so that it outlives noderun. It returns once the
// driver is ready. With created false (the task was not made) it only
// ends the opens.
func (r *Runtime) runDriver(id string, o *fifoOutputs, created bool) error {
	files, err := o.wait(created)
	defer func() {
		for _, f := range files {
			if f != nil {
				f.Close()
			}
		}
	}()
	if err != nil || !created {
		return err
	}
	ready, readyW, err := os.Pipe()
	if err != nil {
		return err
	}
	defer ready.Close()
	u, err := url.Parse(crilog.URI(r.logDriver, o.target))
	if err != nil {
		readyW.Close()
		return err
	}
	cmd := exec.Command(u.Path, "log-driver", u.Query().Get("log-driver"))
	cmd.Env = []string{"CONTAINER_ID=" + id, "CONTAINER_NAMESPACE=" + r.namespace}
	cmd.ExtraFiles = []*os.File{files[0], files[1], readyW}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	readyW.Close()
	if err != nil {
		return fmt.Errorf("log driver of %s: %w", id, err)
	}
	go cmd.Wait() // reaped here while noderun runs, by init after
	ready.SetReadDeadline(time.Now().Add(driverReadyWait))
	if _, err := ready.Read(make([]byte, 1)); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("log driver of %s: ready: %w", id, err)
	}
	return nil
}

// Attach connects an attach session's stdin and terminal size to the
// running container id, as containerd's CRI attach does (AttachOutput
// gives its output). s.Stdin, when not nil, goes to the container's
// stdin until it ends or ctx does; then, with stdinOnce and no terminal,
// the container's stdin is closed (its process reads EOF), while with a
// terminal or without stdinOnce it stays open for the next attach. It
// returns once s.Stdin ended, or at once without it (the sizes are passed
// on until ctx ends).
func (r *Runtime) Attach(ctx context.Context, id string, stdinOnce bool, s execio.ExecIO) error {
	ctx = r.ctx(ctx)
	task, _, err := r.runningTask(ctx, id)
	if err != nil {
		return err
	}
	if s.Resize != nil && s.TTY {
		go resizeExec(ctx, task, s.Resize) // a task is its init process
	}
	if s.Stdin == nil {
		return nil
	}
	// Non-blocking: with no reader it fails at once instead of waiting.
	in, err := os.OpenFile(r.stdinFIFO(id), os.O_WRONLY|unix.O_NONBLOCK, 0)
	if errors.Is(err, unix.ENXIO) {
		// The shim closed its end: stdin was closed (stdinOnce) or the
		// task is ending. As with CRI, the session shows the output.
		return nil
	} else if err != nil {
		return fmt.Errorf("attach to %s: stdin: %w", id, err)
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			in.Close() // ends a write that waits for the process to read
		case <-done:
		}
	}()
	_, err = io.Copy(in, s.Stdin)
	close(done)
	in.Close()
	if stdinOnce && !s.TTY {
		if cerr := task.CloseIO(r.ctx(context.WithoutCancel(ctx)), ctrd.WithStdinCloser); cerr != nil && !errdefs.IsNotFound(cerr) {
			return fmt.Errorf("attach to %s: close stdin: %w", id, cerr)
		}
	}
	if err != nil && ctx.Err() == nil && !errors.Is(err, os.ErrClosed) {
		return fmt.Errorf("attach to %s: stdin: %w", id, err)
	}
	return nil
}

// AttachOutput writes the output of the container id, as it writes it
// from now on, to stdout and stderr (nil with a terminal: its output is
// all stdout) until it ends or ctx does: from the log collector, which
// reads the container's pipes. crilog.ErrNotCollected: no collector holds
// them (the log is where the output is).
func (r *Runtime) AttachOutput(ctx context.Context, id string, stdout, stderr io.Writer) error {
	if r.logCollector == "" {
		return crilog.ErrNotCollected
	}
	return crilog.Attach(ctx, r.logCollector, r.namespace+"/"+id, stdout, stderr)
}
