package containerd

import (
	"context"
	"errors"
	"fmt"

	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/images"
)

// Reset removes what noderun keeps in its containerd namespace once every
// pod is gone: containers left by anything (with their tasks and
// snapshots), image volumes' snapshots, noderun's leases and, with
// removeImages, every image in the namespace and then the namespace itself. A namespace containerd will not
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
	errs = append(errs, r.RemoveImageVolumes(ctx, ""))
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
