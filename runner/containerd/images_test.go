package containerd

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	ctrd "github.com/containerd/containerd"
	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/internal/ociimage"
	"github.com/noderun/noderun/runner"
)

const testSnapshotter = "overlayfs"

// busyboxTar writes a busybox OCI tarball naming names to path.
func busyboxTar(t *testing.T, path string, names ...string) {
	t.Helper()
	_, err := os.Stat(ociimage.BusyboxPath)
	prerequisite(t, err == nil, "busybox-static (apt-get install busybox-static)")
	var imgs []ociimage.Image
	for _, name := range names {
		img, err := ociimage.Busybox(name)
		if err != nil {
			t.Fatal(err)
		}
		imgs = append(imgs, img)
	}
	if err := ociimage.WriteFile(path, imgs...); err != nil {
		t.Fatal(err)
	}
}

func assertUnpacked(t *testing.T, c *ctrd.Client, name, snapshotter string) {
	t.Helper()
	img, err := c.GetImage(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	ok, err := img.IsUnpacked(context.Background(), snapshotter)
	if err != nil || !ok {
		t.Fatalf("%s unpacked in %s = %v, %v", name, snapshotter, ok, err)
	}
}

func TestImportArchive(t *testing.T) {
	c := testClient(t)
	path := filepath.Join(t.TempDir(), "busybox.tar")
	busyboxTar(t, path, "busybox:1.36", "registry.k8s.io/busybox:1.27.2")
	names, err := ImportArchive(context.Background(), c, path, testSnapshotter)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"docker.io/library/busybox:1.36", "registry.k8s.io/busybox:1.27.2"}
	if !slices.Equal(names, want) {
		t.Fatalf("names = %v, want %v", names, want)
	}
	for _, name := range want {
		assertUnpacked(t, c, name, testSnapshotter)
	}
}

func TestImportDir(t *testing.T) {
	c := testClient(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a-corrupt.tar"), []byte("not a tarball"), 0o644); err != nil {
		t.Fatal(err)
	}
	busyboxTar(t, filepath.Join(dir, "b-good.tar"), "good:1")
	busyboxTar(t, filepath.Join(dir, ".in-progress.tar"), "hidden:1")
	busyboxTar(t, filepath.Join(dir, "c-other.tar.gz"), "other:1")
	names, err := ImportDir(context.Background(), c, dir, testSnapshotter, nil, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"docker.io/library/good:1"}; !slices.Equal(names, want) {
		t.Fatalf("names = %v, want %v", names, want)
	}
}

// waitImage polls until name exists or the deadline passes.
func waitImage(t *testing.T, c *ctrd.Client, name string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := c.GetImage(context.Background(), name); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("image %s never imported", name)
}

func TestWatchImagesDir(t *testing.T) {
	c := testClient(t)
	dir := filepath.Join(t.TempDir(), "images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	busyboxTar(t, filepath.Join(dir, "early.tar"), "early:1")

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	ledger := OpenImportLedger(filepath.Join(t.TempDir(), "imports.json"))
	watch, err := WatchImagesDir(ctx, c, dir, testSnapshotter, ledger, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	// Returned at once; the start-up import is under way until watch has
	// done it, and a runtime asking for an image waits meanwhile.
	if !ledger.importing() {
		t.Fatal("start-up imports not marked as under way")
	}
	rt := New(c, testNamespace, filepath.Join(t.TempDir(), "runc"), "/bin/true", WithImportLedger(ledger))
	if _, err := rt.EnsureImage(ctx, "early:1", v1.PullIfNotPresent); !errors.Is(err, runner.ErrImageImporting) {
		t.Fatalf("image asked for during the import: %v, want ErrImageImporting (no pull)", err)
	}
	go func() { done <- watch() }()
	waitImage(t, c, "docker.io/library/early:1")
	for deadline := time.Now().Add(10 * time.Second); ledger.importing(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("start-up imports never marked done")
		}
	}
	if _, err := rt.EnsureImage(ctx, "early:1", v1.PullIfNotPresent); err != nil {
		t.Fatalf("after the import: %v", err)
	}

	// Renamed in whole, as ociimage.WriteFile does.
	staging := t.TempDir()
	busyboxTar(t, filepath.Join(staging, "late.tar"), "late:1")
	if err := os.Rename(filepath.Join(staging, "late.tar"), filepath.Join(dir, "late.tar")); err != nil {
		t.Fatal(err)
	}
	waitImage(t, c, "docker.io/library/late:1")

	// Written in place in two slow halves: imported only once complete.
	writeSlowly(t, staging, filepath.Join(dir, "slow.tar"), "slow:1")
	waitImage(t, c, "docker.io/library/slow:1")
	assertUnpacked(t, c, "docker.io/library/slow:1", testSnapshotter)

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("WatchImagesDir = %v", err)
	}
}

func writeSlowly(t *testing.T, staging, path, name string) {
	t.Helper()
	src := filepath.Join(staging, "src.tar")
	busyboxTar(t, src, name)
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	half := len(data) / 2
	if _, err := f.Write(data[:half]); err != nil {
		t.Fatal(err)
	}
	time.Sleep(settleDelay / 3)
	if _, err := f.Write(data[half:]); err != nil {
		t.Fatal(err)
	}
}

func TestEnsureImage(t *testing.T) {
	c := testClient(t)
	ctx := context.Background()
	// A registry nothing listens on: any pull fails, without network.
	const local = "127.0.0.1:1/busybox:1"
	path := filepath.Join(t.TempDir(), "busybox.tar")
	busyboxTar(t, path, local)
	if _, err := ImportArchive(ctx, c, path, testSnapshotter); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		ref     string
		policy  v1.PullPolicy
		wantErr error
	}{
		{"present IfNotPresent", local, v1.PullIfNotPresent, nil},
		{"present Never", local, v1.PullNever, nil},
		{"present default", local, "", nil},
		{"present Always", local, v1.PullAlways, ErrImagePull},
		{"missing Never", "127.0.0.1:1/missing:1", v1.PullNever, ErrImageNeverPull},
		{"missing IfNotPresent", "127.0.0.1:1/missing:1", v1.PullIfNotPresent, ErrImagePull},
		{"invalid", "Not/A Ref", v1.PullIfNotPresent, ErrInvalidImageName},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			img, err := EnsureImage(ctx, c, tt.ref, tt.policy, testSnapshotter)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if err == nil && img.Name() != local {
				t.Fatalf("image = %s, want %s", img.Name(), local)
			}
		})
	}
}

func TestEnsureImageNormalizesAndUnpacks(t *testing.T) {
	c := testClient(t)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "busybox.tar")
	busyboxTar(t, path, "docker.io/library/busybox:latest")
	if _, err := ImportArchive(ctx, c, path, testSnapshotter); err != nil {
		t.Fatal(err)
	}
	// Present but not unpacked into "native": EnsureImage unpacks it.
	img, err := EnsureImage(ctx, c, "busybox", v1.PullNever, "native")
	if err != nil {
		t.Fatal(err)
	}
	if img.Name() != "docker.io/library/busybox:latest" {
		t.Fatalf("image = %s", img.Name())
	}
	assertUnpacked(t, c, img.Name(), "native")
}

func TestImageConfigOf(t *testing.T) {
	c := testClient(t)
	ctx := context.Background()
	img := ociimage.Image{
		Name:       "example.com/app:v1",
		Files:      map[string]ociimage.File{"/app/run": ociimage.Regular([]byte("#!/bin/sh\n"), 0o755)},
		Entrypoint: []string{"/app/run"},
		Cmd:        []string{"--serve"},
		Env:        []string{"PATH=/app", "MODE=test"},
		WorkingDir: "/app",
		User:       "65534:65534",
		StopSignal: "SIGQUIT",
	}
	path := filepath.Join(t.TempDir(), "app.tar")
	if err := ociimage.WriteFile(path, img); err != nil {
		t.Fatal(err)
	}
	if _, err := ImportArchive(ctx, c, path, testSnapshotter); err != nil {
		t.Fatal(err)
	}
	stored, err := c.GetImage(ctx, img.Name)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ImageConfigOf(ctx, stored)
	if err != nil {
		t.Fatal(err)
	}
	want := runner.ImageConfig{
		Ref:        img.Name,
		Entrypoint: img.Entrypoint,
		Cmd:        img.Cmd,
		Env:        img.Env,
		WorkingDir: img.WorkingDir,
		User:       img.User,
		StopSignal: img.StopSignal,
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ImageConfigOf = %+v, want %+v", got, want)
	}
}

// startRegistry runs Debian's docker-registry on a loopback port and
// returns its host:port.
func startRegistry(t *testing.T) string {
	t.Helper()
	addr := freeAddr(t)
	serveRegistry(t, addr, t.TempDir())
	return addr
}

// TestEnsureImagePulls pushes an image to a loopback registry, forgets it,
// and lets EnsureImage pull and unpack it.
func TestEnsureImagePulls(t *testing.T) {
	c := testClient(t)
	ctx := context.Background()
	name := startRegistry(t) + "/busybox:pulled"
	path := filepath.Join(t.TempDir(), "busybox.tar")
	busyboxTar(t, path, name)
	if _, err := ImportArchive(ctx, c, path, testSnapshotter); err != nil {
		t.Fatal(err)
	}
	img, err := c.GetImage(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Push(ctx, name, img.Target()); err != nil {
		t.Fatal(err)
	}
	if err := c.ImageService().Delete(ctx, name); err != nil {
		t.Fatal(err)
	}
	pulled, err := EnsureImage(ctx, c, name, v1.PullIfNotPresent, "native")
	if err != nil {
		t.Fatal(err)
	}
	assertUnpacked(t, c, pulled.Name(), "native")
	if _, err := EnsureImage(ctx, c, name, v1.PullAlways, testSnapshotter); err != nil {
		t.Fatalf("Always with a reachable registry: %v", err)
	}
}

// Always falls back to the local copy only when the registry cannot be
// reached; a registry that answers "not found" is believed.
func TestPullFallbackOnlyWhenUnreachable(t *testing.T) {
	c := testClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	unreach := "127.0.0.1:1/busybox:1"            // nothing listens there
	answers := startRegistry(t) + "/not-pushed:1" // the registry says 404
	for _, name := range []string{unreach, answers} {
		path := filepath.Join(t.TempDir(), "img.tar")
		busyboxTar(t, path, name)
		if _, err := ImportArchive(ctx, c, path, testSnapshotter); err != nil {
			t.Fatal(err)
		}
	}
	plain := func(ctx context.Context, name string) (ctrd.Image, error) { return pull(ctx, c, name, testSnapshotter) }
	img, pulled, fellBack, err := resolveImage(ctx, c, unreach, v1.PullAlways, true, plain)
	if err != nil || pulled || fellBack == nil || img.Name() != unreach {
		t.Fatalf("unreachable registry with fallback: img %v pulled %t fellBack %v err %v; want the local copy", img, pulled, fellBack, err)
	}
	if _, _, _, err := resolveImage(ctx, c, unreach, v1.PullAlways, false, plain); !errors.Is(err, ErrImagePull) {
		t.Fatalf("unreachable registry without fallback: %v, want ErrImagePull", err)
	}
	if _, _, fb, err := resolveImage(ctx, c, answers, v1.PullAlways, true, plain); !errors.Is(err, ErrImagePull) || fb != nil {
		t.Fatalf("registry answering 404: fellBack %v err %v; want ErrImagePull, no fallback", fb, err)
	}
}

// An unchanged tarball is not read again: with the ledger, a tarball whose
// content went bad but whose size and mtime stayed is skipped, while its
// images are still there; once they are gone, it is read (and fails).
func TestImportLedgerSkipsUnchangedTarballs(t *testing.T) {
	c := testClient(t)
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "busybox.tar")
	busyboxTar(t, path, "example.com/ledger:1")
	ledgerPath := filepath.Join(t.TempDir(), "imports.json")
	ledger := OpenImportLedger(ledgerPath)
	if names, err := ImportDir(ctx, c, dir, testSnapshotter, ledger, testLogger(t)); err != nil || len(names) != 1 {
		t.Fatalf("first import: %v %v", names, err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	// Same size and mtime, content no tarball: only a read would notice.
	if err := os.WriteFile(path, make([]byte, fi.Size()), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	names, err := ImportDir(ctx, c, dir, testSnapshotter, OpenImportLedger(ledgerPath), testLogger(t))
	if err != nil || len(names) != 1 || names[0] != "example.com/ledger:1" {
		t.Fatalf("second start: %v %v; want the remembered image, the tarball unread", names, err)
	}
	if err := c.ImageService().Delete(ctx, "example.com/ledger:1"); err != nil {
		t.Fatal(err)
	}
	if names, _ := ImportDir(ctx, c, dir, testSnapshotter, OpenImportLedger(ledgerPath), testLogger(t)); len(names) != 0 {
		t.Fatalf("image gone from containerd: %v; the tarball must be read again (and here it is broken)", names)
	}
}
