package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/containerd/namespaces"

	"github.com/noderun/noderun/internal/ociimage"
)

// imagesNS is where the images-dir measure imports, apart from the pods'.
const imagesNS = "nrbench-images"

// imagesDirStart times noderun's start (process start to healthy) with
// ImageTarballs large tarballs in its images dir: the first start imports
// them; the second finds them unchanged in its ledger and reads nothing.
func (b *bench) imagesDirStart(ctx context.Context) error {
	n, size := b.cfg.ImageTarballs, b.cfg.ImageTarballMiB
	b.logf("start with %d images of %d MiB in the images dir", n, size)
	src := filepath.Join(b.env.dir, "big-images")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return err
	}
	var tars []string
	for i := range n {
		img, err := ociimage.Busybox(fmt.Sprintf("bench.example/big:%d", i))
		if err != nil {
			return err
		}
		data := make([]byte, size<<20)
		if _, err := rand.Read(data); err != nil {
			return err
		}
		img.Files["/data"] = ociimage.Regular(data, 0o644)
		tar := filepath.Join(src, fmt.Sprintf("big-%d.tar", i))
		if err := ociimage.WriteFile(tar, img); err != nil {
			return err
		}
		tars = append(tars, tar)
	}
	dir := filepath.Join(b.env.dir, "images-node")
	defer b.removeImages(imagesNS)
	for run, out := range []*float64{&b.m.imagesFirstStart, &b.m.imagesSecondStart} {
		t0 := time.Now()
		node, err := startNodeIn(ctx, b.env, dir, imagesNS, tars)
		took := time.Since(t0)
		if err == nil && run == 0 {
			// Imports go on after READY: time them to the last image in.
			err = b.waitImages(ctx, imagesNS, n)
			b.m.imagesImported = time.Since(t0).Seconds()
		}
		if node != nil {
			node.stop()
		}
		if err != nil {
			return fmt.Errorf("images-dir start %d: %w", run+1, err)
		}
		*out = took.Seconds()
	}
	return nil
}

// waitImages waits until namespace ns holds n images.
func (b *bench) waitImages(ctx context.Context, ns string, n int) error {
	nctx := namespaces.WithNamespace(ctx, ns)
	for deadline := time.Now().Add(waitTimeout); ; time.Sleep(20 * time.Millisecond) {
		imgs, err := b.env.client.ImageService().List(nctx)
		if err != nil {
			return err
		}
		if len(imgs) >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d images imported after %s", len(imgs), n, waitTimeout)
		}
	}
}

// removeImages deletes every image in namespace ns (containerd then frees
// their content).
func (b *bench) removeImages(ns string) {
	ctx := namespaces.WithNamespace(context.Background(), ns)
	imgs, err := b.env.client.ImageService().List(ctx)
	if err != nil {
		return
	}
	for _, img := range imgs {
		_ = b.env.client.ImageService().Delete(ctx, img.Name)
	}
}
