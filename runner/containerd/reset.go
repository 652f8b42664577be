package containerd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	ctrd "github.com/containerd/containerd"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/images"

	"github.com/noderun/noderun/runner/volume"
)

// ConnectForReset connects to the containerd noderun recorded, for `noderun
// reset`; nil when none is recorded (noderun never connected, so it holds
// nothing). A managed containerd that is down is started, since only it can
// stop and remove the containers its shims still run; a system one must
// answer now.
func ConnectForReset(ctx context.Context, cfg DaemonConfig) (*Conn, error) {
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

// Reset removes what noderun keeps in its containerd namespace once every
// pod is gone: containers left by anything (with their tasks and
// snapshots), noderun's leases and, with removeImages, every image in the
// namespace and then the namespace itself. A namespace containerd will not
// delete (something else keeps things there) is kept, and kept says so.
func (r *Runtime) Reset(ctx context.Context, removeImages bool) (kept []string, err error) {
	ctx = r.ctx(ctx)
	recs, err := r.client.ContainerService().List(ctx, ownedFilter)
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	var errs []error
	for _, c := range recs {
		errs = append(errs, r.RemoveContainer(ctx, c.ID))
	}
	ls := r.client.LeasesService()
	all, err := ls.List(ctx, fmt.Sprintf("labels.%q", LabelLease))
	if err != nil {
		return nil, fmt.Errorf("list leases: %w", err)
	}
	for _, l := range all {
		if err := ls.Delete(ctx, l); ignoreNotFound(err) != nil {
			errs = append(errs, fmt.Errorf("delete lease %s: %w", l.ID, err))
		}
	}
	if err := errors.Join(errs...); err != nil || !removeImages {
		return nil, err
	}
	if err := r.removeImages(ctx); err != nil {
		return nil, err
	}
	err = r.client.NamespaceService().Delete(ctx, r.namespace)
	switch {
	case errdefs.IsFailedPrecondition(err):
		return []string{fmt.Sprintf("containerd namespace %s: %v", r.namespace, err)}, nil
	case ignoreNotFound(err) != nil:
		return nil, fmt.Errorf("delete containerd namespace %s: %w", r.namespace, err)
	}
	return nil, nil
}

// removeImages deletes every image in the namespace; the last delete waits
// for containerd's garbage collection, which removes their content and
// unpacked snapshots.
func (r *Runtime) removeImages(ctx context.Context) error {
	is := r.client.ImageService()
	imgs, err := is.List(ctx)
	if err != nil {
		return fmt.Errorf("list images: %w", err)
	}
	for i, img := range imgs {
		var opts []images.DeleteOpt
		if i == len(imgs)-1 {
			opts = append(opts, images.SynchronousDelete())
		}
		if err := is.Delete(ctx, img.Name, opts...); ignoreNotFound(err) != nil {
			return fmt.Errorf("delete image %s: %w", img.Name, err)
		}
	}
	r.mu.Lock()
	clear(r.images)
	r.mu.Unlock()
	return nil
}
