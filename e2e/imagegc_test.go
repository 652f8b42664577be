package e2e

import (
	"context"
	"crypto/rand"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/containerd/containerd/namespaces"
	"golang.org/x/sys/unix"

	"github.com/noderun/noderun/internal/ociimage"
	"github.com/noderun/noderun/internal/testnode"
	ctrdrt "github.com/noderun/noderun/runner/containerd"
)

// TestImageGCOnAFullDisk runs noderun on a containerd of its own whose root
// is a 160 MiB tmpfs, fills it with images past the high threshold, and
// watches GC free unused images down to the low threshold while the image a
// pod runs and the images-dir busybox stay.
func TestImageGCOnAFullDisk(t *testing.T) {
	t.Parallel()
	requireE2E(t)
	root := t.TempDir()
	if err := unix.Mount("tmpfs", root, "tmpfs", 0, "size=160m"); err != nil {
		t.Fatalf("tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(root, unix.MNT_DETACH) })
	d, c, err := testnode.StartContainerd(context.Background(), filepath.Join(root, "root"), filepath.Join(t.TempDir(), "state"),
		filepath.Join(t.TempDir(), "c.sock"), filepath.Join(t.TempDir(), "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Stop(context.Background()) })
	t.Cleanup(func() { c.Close() })

	// Each image is ~10 % of the disk; what stays (the pod's image and
	// busybox) ~14 %. The high threshold is below what two spares add, so
	// GC keeps running until all three are gone, though the minimum age
	// (which covers the moments between an import and the manifest naming
	// it) lets them go one run apart.
	n := newNode(t, "--containerd-address", d.Address(), "--image-gc-period", "1s", "--image-minimum-gc-age", "10s",
		"--image-gc-high-threshold", "20", "--image-gc-low-threshold", "18")
	ctx := namespaces.WithNamespace(context.Background(), n.ns)
	// The pod's image is imported last, just before the manifest names
	// it: unused for longer than the minimum age, it would rightly go, and
	// on a busy machine making and importing the others takes that long.
	names := []string{"example.com/spare:1", "example.com/spare:2", "example.com/spare:3", "example.com/app:1"}
	var paths []string
	for i, name := range names {
		img, err := ociimage.Busybox(name)
		if err != nil {
			t.Fatal(err)
		}
		data := make([]byte, 8<<20)
		if _, err := rand.Read(data); err != nil {
			t.Fatal(err)
		}
		img.Files["/data"] = ociimage.Regular(data, 0o644)
		path := filepath.Join(t.TempDir(), fmt.Sprintf("%d.tar", i))
		if err := ociimage.WriteFile(path, img); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, path)
	}
	for _, path := range paths {
		if _, err := ctrdrt.ImportArchive(ctx, c, path, snapshotter); err != nil {
			t.Fatal(err)
		}
	}
	n.writeManifest("app.yaml", imagePod("app", "example.com/app:1", "IfNotPresent"))
	n.waitPod("app", "running", running)

	deadline := time.Now().Add(60 * time.Second)
	for {
		var st unix.Statfs_t
		if err := unix.Statfs(root, &st); err != nil {
			t.Fatal(err)
		}
		usage := 100 * float64(st.Blocks-st.Bavail) / float64(st.Blocks)
		imgs, err := c.ImageService().List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var have []string
		for _, img := range imgs {
			have = append(have, img.Name)
		}
		for _, keep := range []string{"example.com/app:1", "docker.io/library/busybox:1.36"} {
			if !slices.Contains(have, keep) {
				t.Fatalf("GC removed %s, which is in use or in the images dir (images: %v)", keep, have)
			}
		}
		if usage <= 18 {
			t.Logf("usage %.0f%%; images left: %v", usage, have)
			if slices.Contains(have, "example.com/spare:1") && slices.Contains(have, "example.com/spare:2") && slices.Contains(have, "example.com/spare:3") {
				t.Fatal("below the low threshold without removing anything")
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("usage still %.0f%% (low threshold 18%%); images: %v", usage, have)
		}
		time.Sleep(pollEvery)
	}
}
