// Package daemon finds, starts and supervises the containerd noderun uses:
// it chooses between a system containerd and a managed one of its own
// (choice.go), records that choice in the state dir and never switches,
// waits for a recorded daemon that is away, restarts a managed one that
// dies and bounds its log, and for `noderun reset` stops it again. It
// knows nothing of pods: runner/containerd uses the client it returns.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	ctrd "github.com/containerd/containerd"
	"golang.org/x/sys/unix"
)

// ErrNoContainerd means nothing answers at the configured address, and no
// containerd is installed to start a managed one with.
var ErrNoContainerd = errors.New("no containerd available")

const (
	dialTimeout  = 2 * time.Second
	startTimeout = 30 * time.Second
	stopTimeout  = 10 * time.Second
	pollInterval = 50 * time.Millisecond
)

// disabledPlugins keeps the managed daemon small and its start fast: noderun
// needs no CRI, and snapshotters other than overlayfs/native only probe the
// host. The opt plugin would create /opt/containerd outside our directories.
// io.containerd.runtime.v1.linux stays: containerd 1.6's tasks service fails
// to load without it.
var disabledPlugins = []string{
	"io.containerd.grpc.v1.cri",
	"io.containerd.internal.v1.opt",
	"io.containerd.snapshotter.v1.aufs",
	"io.containerd.snapshotter.v1.btrfs",
	"io.containerd.snapshotter.v1.devmapper",
	"io.containerd.snapshotter.v1.zfs",
}

// Config says where to find containerd, or where to run a managed one.
type Config struct {
	Address   string // --containerd-address
	Managed   bool   // --containerd-managed: run a private containerd
	StateDir  string // the choice record; managed containerd root = StateDir/containerd
	RunDir    string // managed state and socket under RunDir/containerd
	Namespace string
	Logger    *slog.Logger
	// Root is where choose looks for service managers and their
	// containerd services ("": /).
	Root string
	// OnWait hears each failed attempt while Connect waits for containerd.
	OnWait func(err error)
}

func (cfg Config) managedSocket() string {
	return filepath.Join(cfg.RunDir, "containerd", "containerd.sock")
}

func (cfg Config) managedLog() string {
	return filepath.Join(cfg.StateDir, "containerd", "containerd.log")
}

func (cfg Config) logger() *slog.Logger {
	if cfg.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return cfg.Logger
}

// Conn is a client of the containerd noderun chose.
type Conn struct {
	Client *ctrd.Client
	Choice
	cfg Config
	// The managed containerd, held by a pidfd (see ensureManaged).
	proc *os.Process
}

// Connect returns a client in cfg.Namespace of the containerd recorded in
// the state dir or, on a first start, of the one choose picks, and records
// it. It never switches daemons: while the chosen one does not answer it
// retries with backoff (until ctx ends), logging each failure. A managed
// containerd runs in its own session so that it outlives noderun, and a
// restarted noderun reuses it (and its running containers).
func Connect(ctx context.Context, cfg Config) (*Conn, error) {
	log := cfg.logger()
	choice, recorded, err := readChoice(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	var why, hint string
	if recorded {
		err = cfg.agrees(choice)
		why, hint = cfg.recordedWhy()
	} else {
		choice, why, err = cfg.choose(ctx)
		hint = "start that containerd, or stop noderun and start it with --containerd-managed to run one of its own"
	}
	if err != nil {
		return nil, err
	}
	if !recorded {
		log.Info("chose the containerd to use", "managed", choice.Managed, "address", choice.Address, "why", why)
	}
	conn, err := cfg.open(ctx, choice, func(ctx context.Context, address string) (*ctrd.Client, error) {
		return cfg.waitFor(ctx, address, why, hint)
	})
	if err != nil {
		return nil, err
	}
	if !recorded {
		if err := writeChoice(cfg.StateDir, conn.Choice); err != nil {
			conn.Client.Close()
			return nil, fmt.Errorf("record the containerd choice: %w", err)
		}
		log.Info("recorded the containerd choice", "address", conn.Address, "managed", conn.Managed,
			"file", choicePath(cfg.StateDir))
	}
	return conn, nil
}

// recordedWhy says why noderun waits for a recorded system containerd that
// does not answer, and what to do: when no service manager will start it,
// only someone starting it by hand ends the wait, and noderun does not
// switch to a managed one itself (the recorded one's pods may still run in
// their shims).
func (cfg Config) recordedWhy() (why, hint string) {
	why = "recorded in " + choicePath(cfg.StateDir)
	hint = "; to run a managed one instead, stop the pods in it, remove " +
		choicePath(cfg.StateDir) + " and start noderun with --containerd-managed"
	root := cfg.hostRoot()
	if svc := systemService(root); svc != "" {
		return why + "; " + svc, "start that containerd" + hint
	}
	return why + "; nothing on this host will start it: " + noService(root),
		"start it by hand (containerd --address " + cfg.Address + ")" + hint
}

// open connects to choice's containerd: a managed one is started if it is
// down, a system one is reached with dialSystem.
func (cfg Config) open(ctx context.Context, choice Choice, dialSystem func(context.Context, string) (*ctrd.Client, error)) (*Conn, error) {
	conn := &Conn{Choice: choice, cfg: cfg}
	var err error
	if choice.Managed {
		conn.Address = cfg.managedSocket()
		conn.Client, conn.proc, err = cfg.ensureManaged(ctx)
	} else {
		conn.Client, err = dialSystem(ctx, choice.Address)
	}
	if err != nil {
		return nil, err
	}
	return conn, nil
}

// Dial connects to the containerd a noderun on these directories uses (the
// recorded one, else the one the flags name) and never starts one: for
// commands run beside noderun.
func Dial(ctx context.Context, cfg Config) (*ctrd.Client, error) {
	choice, recorded, err := readChoice(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	address := cfg.Address
	switch {
	case recorded && choice.Managed, !recorded && cfg.Managed:
		address = cfg.managedSocket()
	case recorded:
		address = choice.Address
	}
	return dial(ctx, address, cfg.Namespace)
}

// Supervise starts the managed containerd again whenever it exits, until
// ctx ends; the engine then adopts the pods in it, as after any containerd
// restart (the shims keep the containers running meanwhile). A system
// containerd is its service manager's business: Supervise returns at once.
// It also keeps the managed daemon's log bounded (log.go).
func (c *Conn) Supervise(ctx context.Context) {
	if !c.Managed {
		return
	}
	go c.cfg.boundDaemonLog(ctx)
	log := c.cfg.logger()
	delay := retryMin
	for {
		started := time.Now()
		waitExit(ctx, c.proc)
		if ctx.Err() != nil {
			return
		}
		// Paced, so a daemon that keeps dying at once is no busy loop.
		if time.Since(started) > time.Minute {
			delay = retryMin
		}
		log.Error("managed containerd exited; starting it again", "pid", c.proc.Pid, "in", delay)
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, retryMax)
		client, proc, err := c.cfg.ensureManaged(ctx)
		if err != nil {
			log.Error("managed containerd not restarted; containers are no longer supervised", "err", err)
			return
		}
		client.Close() // c.Client reconnects by itself
		c.proc = proc
	}
}

// waitExit returns once process p has exited, or ctx ends. It polls: the
// daemon may be an earlier noderun's child, which cannot be waited for.
func waitExit(ctx context.Context, p *os.Process) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for !errors.Is(p.Signal(syscall.Signal(0)), os.ErrProcessDone) {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

const (
	retryMin = time.Second
	retryMax = 30 * time.Second
)

// retry calls try until it succeeds or ctx ends, doubling the pause after
// each failure up to retryMax; each failure is logged and given to OnWait.
func (cfg Config) retry(ctx context.Context, what string, try func() error) error {
	delay := retryMin
	for {
		err := try()
		if err == nil || errors.Is(err, ErrNoContainerd) {
			return err
		}
		cfg.logger().Warn(what+" failed; retrying", "err", err, "retry", delay)
		if cfg.OnWait != nil {
			cfg.OnWait(err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w (last error: %v)", what, ctx.Err(), err)
		case <-time.After(delay):
		}
		delay = min(2*delay, retryMax)
	}
}

// waitFor dials address until containerd answers there. The first
// failure says, once, what noderun waits for and why (which system
// containerd, what makes it expect one), and what to do if none comes.
func (cfg Config) waitFor(ctx context.Context, address, why, hint string) (c *ctrd.Client, err error) {
	said := false
	err = cfg.retry(ctx, "connect to containerd at "+address, func() error {
		c, err = dial(ctx, address, cfg.Namespace)
		if err != nil && !said {
			cfg.logger().Warn("waiting for the system containerd at "+address+"; noderun runs no pod until it answers",
				"why", why, "fix", hint)
			said = true
		}
		return err
	})
	return c, err
}

// ensureManaged connects to the managed containerd, starting it when it
// does not answer; it returns its process. Each try looks for a running one
// first, so that a daemon started by an earlier try is never doubled.
//
// The process is held by a pidfd (os.FindProcess, exec), not by its pid:
// Supervise and StopManaged signal it long after, and on a busy node the
// pid space turns over within minutes, so a bare pid may name another
// process by then.
func (cfg Config) ensureManaged(ctx context.Context) (c *ctrd.Client, proc *os.Process, err error) {
	log := cfg.logger()
	socket := cfg.managedSocket()
	logPath := cfg.managedLog()
	err = cfg.retry(ctx, "start managed containerd", func() error {
		if c, err = dial(ctx, socket, cfg.Namespace); err == nil {
			pid, err := socketPID(socket)
			if err != nil {
				c.Close()
				return err
			}
			if proc, err = os.FindProcess(pid); err != nil {
				c.Close()
				return err
			}
			log.Info("using running managed containerd", "address", socket, "pid", pid)
			return nil
		}
		d, err := Start(ctx, filepath.Join(cfg.StateDir, "containerd"), filepath.Join(cfg.RunDir, "containerd"), socket, logPath)
		if errors.Is(err, exec.ErrNotFound) {
			return fmt.Errorf("%w: no containerd binary on PATH to run the managed containerd with: "+
				"install it (apt-get install containerd runc)", ErrNoContainerd)
		}
		if err != nil {
			return err
		}
		log.Info("started managed containerd", "pid", d.PID(), "address", socket, "log", logPath)
		proc = d.cmd.Process
		c, err = dial(ctx, socket, cfg.Namespace)
		return err
	})
	return c, proc, err
}

// socketPID is the pid of the process listening on a unix socket.
func socketPID(path string) (int, error) {
	conn, err := net.Dial("unix", path)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	raw, err := conn.(*net.UnixConn).SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if credErr != nil {
		return 0, credErr
	}
	return int(cred.Pid), nil
}

// dial connects to address and checks that containerd serves. It fails fast
// when a unix socket file does not exist, where containerd's dialer would
// wait out the whole timeout.
func dial(ctx context.Context, address, namespace string) (*ctrd.Client, error) {
	path := strings.TrimPrefix(address, "unix://")
	if _, err := os.Stat(path); err != nil {
		return nil, err
	}
	opts := []ctrd.ClientOpt{ctrd.WithTimeout(dialTimeout)}
	if namespace != "" {
		opts = append(opts, ctrd.WithDefaultNamespace(namespace))
	}
	c, err := ctrd.New(address, opts...)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	serving, err := c.IsServing(ctx)
	if err == nil && !serving {
		err = errors.New("containerd is not serving")
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("containerd at %q: %w", address, err)
	}
	return c, nil
}

// Process is a containerd started by Start.
type Process struct {
	address string
	cmd     *exec.Cmd
	exited  chan struct{} // closed once the process has been reaped
	waitErr error         // valid after exited is closed
}

// Start starts a containerd whose files all live under root, state
// and socket, logging to logPath, and waits until it serves. The process
// runs in its own session and without NOTIFY_SOCKET, so it neither dies with
// the caller's terminal nor confuses systemd about who is ready.
func Start(ctx context.Context, root, state, socket, logPath string) (*Process, error) {
	bin, err := exec.LookPath("containerd")
	if err != nil {
		return nil, err
	}
	for _, dir := range []string{root, state, filepath.Dir(socket), filepath.Dir(logPath)} {
		if err := os.MkdirAll(dir, 0o711); err != nil {
			return nil, err
		}
	}
	configPath := filepath.Join(state, "noderun-containerd.toml")
	if err := os.WriteFile(configPath, daemonConfig(root, state, socket), 0o600); err != nil {
		return nil, err
	}
	logFile, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child has its own copy

	cmd := exec.Command(bin, "--config", configPath)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = withoutEnv(os.Environ(), "NOTIFY_SOCKET")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start containerd: %w", err)
	}
	d := &Process{address: socket, cmd: cmd, exited: make(chan struct{})}
	go func() {
		d.waitErr = cmd.Wait()
		close(d.exited)
	}()
	if err := d.waitReady(ctx, logPath); err != nil {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout)
		defer cancel()
		return nil, errors.Join(err, d.Stop(stopCtx))
	}
	return d, nil
}

func daemonConfig(root, state, socket string) []byte {
	quoted := make([]string, len(disabledPlugins))
	for i, p := range disabledPlugins {
		quoted[i] = strconv.Quote(p)
	}
	return fmt.Appendf(nil, "version = 2\nroot = %q\nstate = %q\ndisabled_plugins = [%s]\n\n[grpc]\n  address = %q\n",
		root, state, strings.Join(quoted, ", "), socket)
}

func withoutEnv(env []string, name string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if !strings.HasPrefix(kv, name+"=") {
			out = append(out, kv)
		}
	}
	return out
}

func (d *Process) waitReady(ctx context.Context, logPath string) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		select {
		case <-d.exited:
			return fmt.Errorf("containerd exited during start (%v); see %s", d.waitErr, logPath)
		case <-ctx.Done():
			return fmt.Errorf("containerd did not answer on %s: %w; see %s", d.address, ctx.Err(), logPath)
		case <-tick.C:
			if c, err := dial(ctx, d.address, ""); err == nil {
				return c.Close()
			}
		}
	}
}

// Address is the daemon's gRPC socket.
func (d *Process) Address() string { return d.address }

// PID is the daemon's process id.
func (d *Process) PID() int { return d.cmd.Process.Pid }

// Stop sends SIGTERM, then SIGKILL once stopTimeout passes or ctx ends, and
// waits for the process to exit. Containers keep running: their shims are
// separate processes.
func (d *Process) Stop(ctx context.Context) error {
	select {
	case <-d.exited:
		return nil
	default:
	}
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	timer := time.NewTimer(stopTimeout)
	defer timer.Stop()
	select {
	case <-d.exited:
		return nil
	case <-timer.C:
	case <-ctx.Done():
	}
	if err := d.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	<-d.exited
	return nil
}
