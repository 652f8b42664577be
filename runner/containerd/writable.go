package containerd

import (
	"context"
	"fmt"
)

// WritableLayer is a container's writable layer as containerd's CRI plugin
// reports it (ContainerStats.WritableLayer): the snapshotter's Usage of the
// container's active snapshot (keyed by the container's ID here too), and
// the directory of the snapshotter's filesystem (its root, from
// containerd's introspection; "" when it does not say) for the
// filesystem's capacity, as the kubelet fills the container's rootfs.
func (r *Runtime) WritableLayer(ctx context.Context, id string) (used, inodes uint64, fsDir string, err error) {
	ctx = r.ctx(ctx)
	u, err := r.client.SnapshotService(r.snapshotter).Usage(ctx, id)
	if err != nil {
		return 0, 0, "", fmt.Errorf("usage of container %s's snapshot: %w", id, err)
	}
	return uint64(max(u.Size, 0)), uint64(max(u.Inodes, 0)), r.snapshotterRoot(ctx), nil
}

// snapshotterRoot is the snapshotter's root directory, asked of containerd
// once: the CRI plugin's image filesystem path.
func (r *Runtime) snapshotterRoot(ctx context.Context) string {
	r.snapRootMu.Lock()
	defer r.snapRootMu.Unlock()
	if r.snapRoot != "" {
		return r.snapRoot
	}
	resp, err := r.client.IntrospectionService().Plugins(ctx, []string{
		fmt.Sprintf(`type==%q,id==%q`, "io.containerd.snapshotter.v1", r.snapshotter)})
	if err != nil {
		return ""
	}
	for _, p := range resp.Plugins {
		if root := p.Exports["root"]; root != "" {
			r.snapRoot = root
		}
	}
	return r.snapRoot
}
