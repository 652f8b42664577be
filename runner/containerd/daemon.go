package containerd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	ctrd "github.com/containerd/containerd"
)

// ErrNoContainerd means nothing answered at the configured address and no
// containerd could be started.
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

// DaemonConfig says where to find containerd, or where to run a managed one.
type DaemonConfig struct {
	Address   string // --containerd-address; tried first
	StateDir  string // managed containerd root = StateDir/containerd
	RunDir    string // managed state and socket under RunDir/containerd
	Namespace string
	Logger    *slog.Logger
}

func (cfg DaemonConfig) managedSocket() string {
	return filepath.Join(cfg.RunDir, "containerd", "containerd.sock")
}

// Connect returns a client in cfg.Namespace for the first containerd that
// answers: the one at cfg.Address, a managed one left running by an earlier
// noderun, or a new managed one started now. The managed daemon runs in its
// own session so it outlives noderun and a restarted noderun reuses it (and
// its running containers).
func Connect(ctx context.Context, cfg DaemonConfig) (*ctrd.Client, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Address != "" {
		c, err := dial(ctx, cfg.Address, cfg.Namespace)
		if err == nil {
			return c, nil
		}
		log.Info("containerd does not answer; trying a managed one", "address", cfg.Address, "err", err)
	}
	socket := cfg.managedSocket()
	if c, err := dial(ctx, socket, cfg.Namespace); err == nil {
		log.Info("reusing managed containerd", "address", socket)
		return c, nil
	}
	logPath := filepath.Join(cfg.StateDir, "containerd", "containerd.log")
	d, err := StartDaemon(ctx, filepath.Join(cfg.StateDir, "containerd"), filepath.Join(cfg.RunDir, "containerd"), socket, logPath)
	if errors.Is(err, exec.ErrNotFound) {
		return nil, fmt.Errorf("%w: nothing answers at %q and there is no containerd binary on PATH: "+
			"install it (apt-get install containerd runc) or point --containerd-address at a running containerd",
			ErrNoContainerd, cfg.Address)
	}
	if err != nil {
		return nil, err
	}
	log.Info("started managed containerd", "pid", d.PID(), "address", socket, "log", logPath)
	return dial(ctx, socket, cfg.Namespace)
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

// Daemon is a containerd process started by StartDaemon.
type Daemon struct {
	address string
	cmd     *exec.Cmd
	exited  chan struct{} // closed once the process has been reaped
	waitErr error         // valid after exited is closed
}

// StartDaemon starts a containerd whose files all live under root, state
// and socket, logging to logPath, and waits until it serves. The process
// runs in its own session and without NOTIFY_SOCKET, so it neither dies with
// the caller's terminal nor confuses systemd about who is ready.
func StartDaemon(ctx context.Context, root, state, socket, logPath string) (*Daemon, error) {
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
	d := &Daemon{address: socket, cmd: cmd, exited: make(chan struct{})}
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

func (d *Daemon) waitReady(ctx context.Context, logPath string) error {
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
func (d *Daemon) Address() string { return d.address }

// PID is the daemon's process id.
func (d *Daemon) PID() int { return d.cmd.Process.Pid }

// Stop sends SIGTERM, then SIGKILL once stopTimeout passes or ctx ends, and
// waits for the process to exit. Containers keep running: their shims are
// separate processes.
func (d *Daemon) Stop(ctx context.Context) error {
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
