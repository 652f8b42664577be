package containerd

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/containerd/snapshots"
	"golang.org/x/sys/unix"

	"github.com/noderun/noderun/runner"
	"github.com/noderun/noderun/runner/volume"
)

func (r *Runtime) imageVolumeSnapshots(t *testing.T) []snapshots.Info {
	t.Helper()
	var out []snapshots.Info
	err := r.client.SnapshotService(r.snapshotter).Walk(r.ctx(context.Background()), func(_ context.Context, i snapshots.Info) error {
		out = append(out, i)
		return nil
	}, `labels."`+LabelImageVolumePod+`"`)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// An image volume on a real containerd: the image's files, read-only, from
// one view snapshot per pod and image that a second mount reuses, after an
// unmount (a reboot) too; image GC
// keeps the image while the snapshot lasts, even with no manifest naming
// it; RemoveImageVolumes, after the unmount, and Reset remove the views.
func TestImageVolumeSnapshot(t *testing.T) {
	rt := testRuntime(t)
	ctx := context.Background()
	dir := t.TempDir()
	t.Cleanup(func() { _ = volume.UnmountAll(dir) })
	target, err := rt.MountImageVolume(ctx, "pod-a", testImage, dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(target, "bin", "busybox")); err != nil {
		t.Errorf("the image's files are not in the volume: %v", err)
	}
	if err := os.WriteFile(filepath.Join(target, "x"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Errorf("a write into the volume: %v, want EROFS", err)
	}
	if again, err := rt.MountImageVolume(ctx, "pod-a", testImage, dir); err != nil || again != target {
		t.Errorf("second mount = %q, %v; want %q", again, err, target)
	}
	snaps := rt.imageVolumeSnapshots(t)
	if len(snaps) != 1 || snaps[0].Kind != snapshots.KindView || snaps[0].Labels[LabelImageVolumePod] != "pod-a" {
		t.Fatalf("image volume snapshots %+v, want pod-a's one view", snaps)
	}

	removed, err := rt.GCImages(ctx, nil, runner.ImageGCPolicy{})
	if err != nil || len(removed) != 0 {
		t.Errorf("GC removed %v (%v), though a snapshot mounts the image", removed, err)
	}

	// A reboot unmounts it; the next start mounts the same view again.
	if err := volume.UnmountAll(dir); err != nil {
		t.Fatal(err)
	}
	if again, err := rt.MountImageVolume(ctx, "pod-a", testImage, dir); err != nil || again != target || len(rt.imageVolumeSnapshots(t)) != 1 {
		t.Fatalf("mount after the unmount = %q, %v, %d snapshots; want %q on the same one", again, err, len(rt.imageVolumeSnapshots(t)), target)
	}
	if _, err := os.Stat(filepath.Join(target, "bin", "busybox")); err != nil {
		t.Errorf("the image's files are not in the volume mounted again: %v", err)
	}
	if err := volume.UnmountAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := rt.RemoveImageVolumes(ctx, "pod-b"); err != nil || len(rt.imageVolumeSnapshots(t)) != 1 {
		t.Fatalf("another pod's removal (%v) touched pod-a's snapshot", err)
	}
	if err := rt.RemoveImageVolumes(ctx, "pod-a"); err != nil || len(rt.imageVolumeSnapshots(t)) != 0 {
		t.Fatalf("RemoveImageVolumes = %v, snapshots left %d", err, len(rt.imageVolumeSnapshots(t)))
	}

	// Another pod's, left for reset.
	if _, err := rt.MountImageVolume(ctx, "pod-c", testImage, dir); err != nil {
		t.Fatal(err)
	}
	if err := volume.UnmountAll(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Reset(ctx, false); err != nil || len(rt.imageVolumeSnapshots(t)) != 0 {
		t.Fatalf("Reset = %v, image volume snapshots left %d", err, len(rt.imageVolumeSnapshots(t)))
	}
}
