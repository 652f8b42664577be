package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	ctrd "github.com/containerd/containerd"

	"github.com/noderun/noderun/runner/volume"
)

// ConnectForReset connects to the containerd noderun recorded, for `noderun
// reset`; nil when none is recorded (noderun never connected, so it holds
// nothing). A managed containerd that is down is started, since only it can
// stop and remove the containers its shims still run; a system one must
// answer now.
func ConnectForReset(ctx context.Context, cfg Config) (*Conn, error) {
	choice, recorded, err := readChoice(cfg.StateDir)
	if err != nil || !recorded {
		return nil, err
	}
	conn, err := cfg.open(ctx, choice, func(ctx context.Context, address string) (*ctrd.Client, error) {
		return dial(ctx, address, cfg.Namespace) // answering now, not waited for
	})
	if err != nil {
		return nil, fmt.Errorf("containerd recorded in %s: %w", choicePath(cfg.StateDir), err)
	}
	return conn, nil
}

// StopManaged stops the managed containerd noderun started (SIGTERM, then
// SIGKILL after stopTimeout) and removes its root and state directories;
// for a system containerd it does nothing. Call it after every container
// is removed: their shims outlive the daemon.
func (c *Conn) StopManaged(ctx context.Context) error {
	if !c.Managed {
		return nil
	}
	c.Client.Close()
	if err := c.proc.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("stop managed containerd (pid %d): %w", c.proc.Pid, err)
	}
	tctx, cancel := context.WithTimeout(ctx, stopTimeout)
	waitExit(tctx, c.proc)
	cancel()
	if err := c.proc.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill managed containerd (pid %d): %w", c.proc.Pid, err)
	}
	waitExit(ctx, c.proc)
	var errs []error
	for _, dir := range []string{filepath.Join(c.cfg.StateDir, "containerd"), filepath.Join(c.cfg.RunDir, "containerd")} {
		errs = append(errs, volume.RemoveTree(dir))
	}
	return errors.Join(errs...)
}
