package containerd

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd/images"
	"github.com/distribution/reference"
	"golang.org/x/sys/unix"

	"github.com/noderun/noderun/runner"
)

// imageUse remembers when each image was first seen and last in use, as
// the kubelet's image manager does; only what noderun saw counts, so an
// image is never older than noderun's own start.
type imageUse struct {
	mu    sync.Mutex
	first map[string]time.Time
	last  map[string]time.Time
}

// GCImages removes images no pod uses when the image filesystem is above
// the policy's high threshold, least recently used first, until it is at
// the low threshold. keep holds image references (as manifests write them)
// that must stay; images imported from a tarball that is still in the
// images dir stay too, and those an image volume's snapshot holds (the
// kubelet's handleImageVolumes), whatever the manifests say now: a pod
// being removed still mounts its. It returns the images it removed.
func (r *Runtime) GCImages(ctx context.Context, keep []string, p runner.ImageGCPolicy) ([]string, error) {
	ctx = r.ctx(ctx)
	capacity, avail, err := r.imageFS(ctx)
	if err != nil {
		return nil, err
	}
	usage := 100 * float64(capacity-avail) / float64(capacity)
	imgs, err := r.client.ImageService().List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	kept := r.keptImages(keep)
	if err := r.mountedImages(ctx, kept); err != nil {
		return nil, err
	}
	now := time.Now()
	r.use.note(imgs, kept, now)
	if usage < float64(p.HighThresholdPercent) {
		return nil, nil
	}
	var candidates []images.Image
	for _, img := range imgs {
		if !kept[img.Name] && now.Sub(r.use.firstSeen(img.Name)) >= p.MinAge {
			candidates = append(candidates, img)
		}
	}
	slices.SortFunc(candidates, func(a, b images.Image) int { return r.use.lastUsed(a.Name).Compare(r.use.lastUsed(b.Name)) })
	var removed []string
	for _, img := range candidates {
		// Deleting synchronously runs containerd's GC, which frees the
		// content and the unpacked layers no kept image shares; what that
		// freed is read from the filesystem, not estimated.
		if err := r.client.ImageService().Delete(ctx, img.Name, images.SynchronousDelete()); err != nil {
			return removed, fmt.Errorf("remove image %s: %w", img.Name, err)
		}
		r.forgetImage(img.Target.Digest.String())
		removed = append(removed, img.Name)
		if capacity, avail, err = r.imageFS(ctx); err != nil {
			return removed, err
		}
		if 100*float64(capacity-avail)/float64(capacity) <= float64(p.LowThresholdPercent) {
			break
		}
	}
	if len(removed) > 0 {
		r.log.Info("image garbage collection", "usage", fmt.Sprintf("%.0f%%", usage), "removed", removed)
	}
	return removed, nil
}

// keptImages normalizes keep and adds the images of tarballs still in the
// images dir.
func (r *Runtime) keptImages(keep []string) map[string]bool {
	out := map[string]bool{}
	for _, ref := range keep {
		if named, err := reference.ParseDockerRef(ref); err == nil {
			out[named.String()] = true
		}
	}
	for _, name := range r.ledger.present() {
		out[name] = true
	}
	return out
}

// imageFS is the size and free space of the filesystem holding
// containerd's content store.
func (r *Runtime) imageFS(ctx context.Context) (capacity, avail uint64, err error) {
	resp, err := r.client.IntrospectionService().Plugins(ctx, []string{`type=="io.containerd.content.v1"`})
	if err != nil {
		return 0, 0, fmt.Errorf("find the content store: %w", err)
	}
	for _, p := range resp.Plugins {
		if root := p.Exports["root"]; root != "" {
			var st unix.Statfs_t
			if err := unix.Statfs(root, &st); err != nil {
				return 0, 0, fmt.Errorf("statfs %s: %w", root, err)
			}
			return st.Blocks * uint64(st.Bsize), st.Bavail * uint64(st.Bsize), nil
		}
	}
	return 0, 0, fmt.Errorf("containerd reports no content store root")
}

// forgetImage drops what was cached about a removed image: its facts and
// the users looked up in it (keys "<repo>@<digest>|…").
func (r *Runtime) forgetImage(digest string) {
	r.mu.Lock()
	delete(r.images, digest)
	for k := range r.users {
		if strings.Contains(k, "@"+digest+"|") {
			delete(r.users, k)
		}
	}
	r.mu.Unlock()
}

// note records first sight of every image and use of the kept ones.
func (u *imageUse) note(imgs []images.Image, inUse map[string]bool, now time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.first == nil {
		u.first, u.last = map[string]time.Time{}, map[string]time.Time{}
	}
	present := map[string]bool{}
	for _, img := range imgs {
		present[img.Name] = true
		if _, ok := u.first[img.Name]; !ok {
			u.first[img.Name] = now
		}
		if inUse[img.Name] {
			u.last[img.Name] = now
		}
	}
	for name := range u.first {
		if !present[name] {
			delete(u.first, name)
			delete(u.last, name)
		}
	}
}

func (u *imageUse) firstSeen(name string) time.Time {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.first[name]
}

func (u *imageUse) lastUsed(name string) time.Time {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.last[name] // zero: never seen in use, removed first
}
