package containerd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/mount"
	"github.com/containerd/containerd/snapshots"
	"github.com/distribution/reference"
	"github.com/moby/sys/mountinfo"
	"github.com/opencontainers/image-spec/identity"
)

// Image volumes, as containerd's CRI plugin makes them (2.x,
// internal/cri/server/container_image_mount.go): the image's unpacked
// layers under a snapshot of their own, one per pod and image, mounted in
// a directory of the pod's that the containers bind read-only. noderun's
// snapshot is a view, read-only at the snapshotter too (containerd 2.1's
// first version took a view; later ones an active snapshot for user
// namespaces' idmaps, which noderun's pods do not have).
//
// containerd ties its snapshot to the sandbox's lease; noderun's pods have
// no sandbox record, and a lease of a process that is gone is released at
// the next start (leases.go). So the snapshot is a GC root of its own,
// labelled with the pod's UID: RemoveImageVolumes finds it when the pod is
// removed, after a crash or a reboot too (its pod dir says it is to be
// removed), and Reset finds every one. Image GC keeps the image while the
// snapshot lasts.

// LabelImageVolumePod marks an image volume's snapshot with its pod's UID,
// and LabelImageVolumeImage with its image's name, which image GC keeps.
const (
	LabelImageVolumePod   = labelPrefix + "image-volume.pod"
	LabelImageVolumeImage = labelPrefix + "image-volume.image"
)

// labelGCRoot keeps a snapshot from containerd's garbage collection.
const labelGCRoot = "containerd.io/gc.root"

// imageVolumePrefix starts the key of every image volume snapshot.
const imageVolumePrefix = "noderun-image-volume-"

// MountImageVolume mounts the root filesystem of image ref read-only at
// dir/<image digest>, from a view snapshot keyed by pod and image, and
// returns that directory. Mounted already (another container of the pod,
// a restarted noderun), it is only returned; after a reboot the snapshot
// is mounted again.
func (r *Runtime) MountImageVolume(ctx context.Context, podUID, ref, dir string) (string, error) {
	ctx = r.ctx(ctx)
	named, err := reference.ParseDockerRef(ref)
	if err != nil {
		return "", fmt.Errorf("%w: %q: %w", ErrInvalidImageName, ref, err)
	}
	img, err := r.client.GetImage(ctx, named.String())
	if err != nil {
		return "", fmt.Errorf("image %s: %w", named, err)
	}
	target := filepath.Join(dir, img.Target().Digest.Encoded())
	if mounted, err := mountinfo.Mounted(target); err == nil && mounted {
		return target, nil
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("image volume %s: %w", target, err)
	}
	if err := ensureUnpacked(ctx, r.client, img, r.snapshotter); err != nil {
		return "", err
	}
	diffIDs, err := img.RootFS(ctx)
	if err != nil {
		return "", fmt.Errorf("image %s rootfs: %w", named, err)
	}
	key := imageVolumePrefix + podUID + "-" + img.Target().Digest.Encoded()
	labels := map[string]string{
		LabelImageVolumePod:   podUID,
		LabelImageVolumeImage: img.Name(),
		labelGCRoot:           time.Now().UTC().Format(time.RFC3339),
	}
	sn := r.client.SnapshotService(r.snapshotter)
	ms, err := sn.View(ctx, key, identity.ChainID(diffIDs).String(), snapshots.WithLabels(labels))
	if errdefs.IsAlreadyExists(err) {
		ms, err = sn.Mounts(ctx, key)
	}
	if err != nil {
		return "", fmt.Errorf("image volume snapshot of %s: %w", named, err)
	}
	if err := os.MkdirAll(target, 0o755); err != nil {
		return "", err
	}
	if err := mount.All(ms, target); err != nil {
		return "", fmt.Errorf("mount image volume of %s: %w", named, err)
	}
	return target, nil
}

// RemoveImageVolumes removes the image volume snapshots of the pod (of
// every pod, for ""), whose mounts the caller removed.
func (r *Runtime) RemoveImageVolumes(ctx context.Context, podUID string) error {
	ctx = r.ctx(ctx)
	filter := fmt.Sprintf("labels.%q", LabelImageVolumePod)
	if podUID != "" {
		filter = fmt.Sprintf("labels.%q==%q", LabelImageVolumePod, podUID)
	}
	sn := r.client.SnapshotService(r.snapshotter)
	var keys []string
	err := sn.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		keys = append(keys, info.Name)
		return nil
	}, filter)
	if err != nil {
		return fmt.Errorf("list image volume snapshots: %w", err)
	}
	var errs []error
	for _, k := range keys {
		if err := sn.Remove(ctx, k); ignoreNotFound(err) != nil {
			errs = append(errs, fmt.Errorf("remove image volume snapshot %s: %w", k, err))
		}
	}
	return errors.Join(errs...)
}

// mountedImages adds to kept the images of every image volume snapshot.
func (r *Runtime) mountedImages(ctx context.Context, kept map[string]bool) error {
	err := r.client.SnapshotService(r.snapshotter).Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		kept[info.Labels[LabelImageVolumeImage]] = true
		return nil
	}, fmt.Sprintf("labels.%q", LabelImageVolumeImage))
	if err != nil {
		return fmt.Errorf("list image volume snapshots: %w", err)
	}
	return nil
}
