package testnode

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/errdefs"

	"github.com/noderun/noderun/runner/containerd/daemon"
)

// StartContainerd starts a private containerd with the given root, state,
// socket (a short path: it must fit sun_path) and log, and connects to it.
func StartContainerd(ctx context.Context, root, state, socket, log string) (*daemon.Process, *containerd.Client, error) {
	d, err := daemon.Start(ctx, root, state, socket, log)
	if err != nil {
		return nil, nil, err
	}
	c, err := containerd.New(d.Address(), containerd.WithTimeout(10*time.Second))
	if err != nil {
		return nil, nil, errors.Join(err, d.Stop(ctx))
	}
	return d, c, nil
}

// RemoveContainers deletes every container in ctx's namespace with its
// task and snapshot; the shims exit with their tasks.
func RemoveContainers(ctx context.Context, client *containerd.Client) error {
	cs, err := client.Containers(ctx)
	if err != nil {
		return fmt.Errorf("list containers: %w", err)
	}
	var errs []error
	for _, c := range cs {
		if task, err := c.Task(ctx, nil); err == nil {
			if _, err := task.Delete(ctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("delete task %s: %w", c.ID(), err))
			}
		}
		if err := c.Delete(ctx, containerd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete container %s: %w", c.ID(), err))
		}
	}
	return errors.Join(errs...)
}
