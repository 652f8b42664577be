package containerd

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	ctrd "github.com/containerd/containerd"
	"golang.org/x/sys/unix"

	"github.com/noderun/noderun/internal/ociimage"
	"github.com/noderun/noderun/internal/testenv"
	"github.com/noderun/noderun/runner"
	"github.com/noderun/noderun/runner/containerd/daemon"
)

// TestGCImagesOnASmallFilesystem fills a containerd whose root is a 160 MiB
// tmpfs with images of incompressible data past the high threshold: GC
// removes unused ones, least recently used first, down to the low
// threshold, and keeps the referenced image and the one whose tarball is
// still in the images dir.
func TestGCImagesOnASmallFilesystem(t *testing.T) {
	testenv.RequireContainerd(t)
	root := t.TempDir()
	if err := unix.Mount("tmpfs", root, "tmpfs", 0, "size=160m"); err != nil {
		t.Fatalf("tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(root, unix.MNT_DETACH) })
	d, err := daemon.Start(context.Background(), filepath.Join(root, "root"), filepath.Join(t.TempDir(), "state"),
		filepath.Join(testenv.ShortTempDir(t), "c.sock"), filepath.Join(t.TempDir(), "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Stop(context.Background()) })
	c, err := ctrd.New(d.Address(), ctrd.WithDefaultNamespace(testNamespace))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	imagesDir := t.TempDir()
	ledger := OpenImportLedger(filepath.Join(t.TempDir(), "imports.json"))
	rt := New(c, testNamespace, filepath.Join(t.TempDir(), "runc"), "/bin/true", WithLogger(testLogger(t)), WithImportLedger(ledger))
	ctx := context.Background()

	names := []string{"example.com/used:1", "example.com/tarball:1", "example.com/old:1", "example.com/older:1", "example.com/oldest:1"}
	for i, name := range names {
		if name == "example.com/tarball:1" {
			// Imported from the images dir, where its tarball stays: kept.
			bigImage(t, filepath.Join(imagesDir, "tarball.tar"), name)
			if got, err := ImportDir(ctx, c, imagesDir, testSnapshotter, ledger, testLogger(t)); err != nil || len(got) != 1 {
				t.Fatalf("import %s: %v %v", name, got, err)
			}
			continue
		}
		path := filepath.Join(t.TempDir(), fmt.Sprintf("%d.tar", i))
		bigImage(t, path, name)
		if _, err := ImportArchive(ctx, c, path, testSnapshotter); err != nil {
			t.Fatalf("import %s: %v", name, err)
		}
	}
	capacity, avail, err := rt.imageFS(rt.ctx(ctx))
	if err != nil {
		t.Fatal(err)
	}
	before := 100 * float64(capacity-avail) / float64(capacity)
	t.Logf("image filesystem %.0f%% full before GC", before)
	// A first look, below its high threshold, sees "old" in use: it is
	// then the most recently used of the unused images.
	if removed, _ := rt.GCImages(ctx, []string{"example.com/used:1", "example.com/old:1"}, runner.ImageGCPolicy{HighThresholdPercent: 99}); len(removed) != 0 {
		t.Fatalf("removed %v below the high threshold", removed)
	}
	// Each image is about 10 % of the filesystem: two must go.
	policy := runner.ImageGCPolicy{HighThresholdPercent: int(before) - 5, LowThresholdPercent: int(before) - 15}
	// "used" is what a manifest names (short forms are normalized by GC).
	removed, err := rt.GCImages(ctx, []string{"example.com/used:1"}, policy)
	if err != nil {
		t.Fatal(err)
	}
	capacity, avail, _ = rt.imageFS(rt.ctx(ctx))
	after := 100 * float64(capacity-avail) / float64(capacity)
	t.Logf("removed %v; %.0f%% full after", removed, after)
	slices.Sort(removed)
	if !slices.Equal(removed, []string{"example.com/older:1", "example.com/oldest:1"}) {
		t.Fatalf("removed %v, want the two never-used images and not the recently used old:1, used:1 or tarball:1", removed)
	}
	if after > float64(policy.LowThresholdPercent) {
		t.Fatalf("usage %.0f%% after GC, want at most the low threshold %d%%", after, policy.LowThresholdPercent)
	}
	for _, name := range []string{"example.com/used:1", "example.com/tarball:1"} {
		if _, err := c.GetImage(rt.ctx(ctx), name); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	// An image seen for less than the minimum age stays.
	if removed, _ := rt.GCImages(ctx, nil, runner.ImageGCPolicy{HighThresholdPercent: 0, LowThresholdPercent: 0, MinAge: time.Hour}); len(removed) != 0 {
		t.Errorf("removed %v younger than the minimum age", removed)
	}
}

// bigImage writes a busybox image with 8 MiB of random bytes.
func bigImage(t *testing.T, path, name string) {
	t.Helper()
	img, err := ociimage.Busybox(name)
	if err != nil {
		t.Skip(err)
	}
	data := make([]byte, 8<<20)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	img.Files["/data"] = ociimage.Regular(data, 0o644)
	if err := ociimage.WriteFile(path, img); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatal(err)
	}
}
