package runner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Download, then replace: a manifest edit gives a pod a new version (a new
// UID), which starts only once the old one is gone. When the new version
// runs other images, it first pulls them while the old one keeps running,
// so an update over a slow link costs the restart, not the pull. A pull
// that fails keeps the old version running and is retried with the
// kubelet's image backoff. Edits that keep the images replace the pod at
// once, as before.

// The events of the pulls ahead, recorded on the old version: it is the
// one listed (and kubectl describe shows) until the new one replaces it.
const (
	reasonUpdatePulling    = "UpdatePulling"
	reasonUpdatePulled     = "UpdatePulled"
	reasonUpdatePullFailed = "UpdatePullFailed"
)

// pullAheadKey holds the pulls ahead back in podState's pullUntil and
// backoff maps (no container is named so: names are DNS labels).
const pullAheadKey = "pull-ahead:"

// readPodsOnDisk reads the saved spec of each pod that ran (a state dir)
// and that no source wants, once per pod: after a noderun restart in the
// middle of a pull ahead, the old version is known only so. Run's
// goroutine only.
func (e *Engine) readPodsOnDisk(want map[types.UID]*v1.Pod, ran map[types.UID]bool) {
	for uid := range e.diskPods {
		if !ran[uid] || want[uid] != nil {
			delete(e.diskPods, uid)
		}
	}
	for uid := range ran {
		if _, read := e.diskPods[uid]; read || want[uid] != nil {
			continue
		}
		p, err := loadPod(e.cfg.StateDir, uid)
		if err != nil || p.UID != uid {
			p = nil // an orphan as removeOrphans knows it
		}
		e.diskPods[uid] = p
	}
}

// gateLocked finds the pods of run that replace an older version of the
// same namespace/name that runs other images, and have not pulled them
// yet; it records them (replacing) and returns the old versions' UIDs,
// which keep running meanwhile. An old version found only on disk (a
// noderun restart during the pull) gets a worker again, which adopts it.
// e.mu is held.
func (e *Engine) gateLocked(ctx context.Context, run map[types.UID]*v1.Pod, held map[types.UID]bool) map[types.UID]bool {
	olds := map[string]*podWorker{}
	for uid, w := range e.workers {
		// A new version still pulling is not an old one: when a newer
		// edit supersedes it, it goes.
		if _, wanted := run[uid]; wanted || e.replacing[uid] != nil || w.isKilling() {
			continue
		}
		if p := w.lastPod(); p != nil {
			olds[podRef(p)] = w
		}
	}
	onDisk := map[string]*v1.Pod{}
	for uid, p := range e.diskPods {
		if p != nil && e.workers[uid] == nil {
			onDisk[podRef(p)] = p
		}
	}
	replacing, keep := map[types.UID]*podWorker{}, map[types.UID]bool{}
	for uid, pod := range run {
		if held[uid] || e.imagesIn[uid] {
			continue
		}
		ref := podRef(pod)
		old := olds[ref]
		if p := onDisk[ref]; old == nil && p != nil && !sameImages(p, pod) {
			e.log.Info("keeping the old version of a pod running while the new one's images are pulled", "pod", ref, "uid", p.UID)
			old = e.startWorkerLocked(ctx, p.UID)
			old.update(p)
			olds[ref] = old
		}
		if old == nil || sameImages(old.lastPod(), pod) {
			continue
		}
		replacing[uid], keep[old.uid] = old, true
	}
	e.replacing = replacing
	for uid := range e.imagesIn {
		if run[uid] == nil {
			delete(e.imagesIn, uid)
		}
	}
	return keep
}

// sameImages reports whether two versions of a pod run (or mount) the
// same images.
func sameImages(a, b *v1.Pod) bool {
	images := func(p *v1.Pod) []string {
		var out []string
		for _, r := range podPulls(p) {
			out = append(out, r.ref)
		}
		slices.Sort(out)
		return slices.Compact(out)
	}
	return slices.Equal(images(a), images(b))
}

// podPulls are the images a pod's starts need: its containers' and those
// of the image volumes they mount.
func podPulls(pod *v1.Pod) []pullRequest {
	var out []pullRequest
	volumes := map[string]bool{}
	for i, c := range allContainers(pod) {
		out = append(out, containerPull(c, i < len(pod.Spec.InitContainers)))
		for _, v := range mountedImageVolumes(pod, c) {
			if !volumes[v.Name] {
				volumes[v.Name] = true
				out = append(out, volumePull(v))
			}
		}
	}
	return out
}

// replacement returns the old version that pod uid waits to replace until
// its images are pulled, nil when it waits for none.
func (e *Engine) replacement(uid types.UID) *v1.Pod {
	e.mu.Lock()
	defer e.mu.Unlock()
	if w := e.replacing[uid]; w != nil {
		return w.lastPod()
	}
	return nil
}

// imagesPulled lets the old version that pod uid replaces go, its images
// being in.
func (e *Engine) imagesPulled(uid types.UID) {
	e.mu.Lock()
	defer e.mu.Unlock()
	old := e.replacing[uid]
	if old == nil {
		return // no longer a replacement; apply decided meanwhile
	}
	delete(e.replacing, uid)
	e.imagesIn[uid] = true
	old.kill()
}

// pullAhead pulls every image of pod, per its pull policies, while old,
// the version it replaces, keeps running. It returns done once all are in;
// otherwise when to try again (0: the sync was ended).
func (w *podWorker) pullAhead(ctx context.Context, pod, old *v1.Pod) (retry time.Duration, done bool) {
	now := w.env.clock.Now()
	if left := w.st.pullUntil[pullAheadKey].Sub(now); left > 0 {
		return left, false
	}
	if w.st.pulledAhead == nil {
		w.st.pulledAhead = map[string]ImageConfig{}
	}
	for _, r := range podPulls(pod) {
		if _, ok := w.st.pulledAhead[r.key]; ok {
			continue
		}
		img, err := w.pullOneAhead(ctx, pod, old, r)
		switch {
		case ctx.Err() != nil:
			return 0, false
		case errors.Is(err, ErrImageImporting):
			return 500 * time.Millisecond, false
		case err != nil:
			wait := w.holdPulls(pullAheadKey)
			w.env.log.Warn("image of a pod's new version not available; the old version keeps running",
				"pod", podRef(pod), "image", r.ref, "retry", wait, "err", err)
			w.event(old, "", false, v1.EventTypeWarning, reasonUpdatePullFailed, fmt.Sprintf(
				"Failed to pull image %q for the pod's new version (uid %s): %v; this version keeps running, next try in %s", r.ref, pod.UID, err, wait))
			return wait, false
		}
		w.st.pulledAhead[r.key] = img
	}
	delete(w.st.backoff, "pull:"+pullAheadKey)
	delete(w.st.pullUntil, pullAheadKey)
	return 0, true
}

// pullOneAhead gets r's image as ensureImage does, telling of a pull on
// old, the version that runs meanwhile.
func (w *podWorker) pullOneAhead(ctx context.Context, pod, old *v1.Pod, r pullRequest) (ImageConfig, error) {
	var began time.Time
	trace := &PullTrace{Start: func(string) {
		began = w.env.clock.Now()
		w.event(old, "", false, v1.EventTypeNormal, reasonUpdatePulling, fmt.Sprintf(
			"Pulling image %q for the pod's new version (uid %s) while this version keeps running", r.ref, pod.UID))
	}}
	img, err := w.env.rt.EnsureImage(WithPullTrace(ctx, trace), r.ref, r.policy)
	if err == nil && !began.IsZero() {
		w.event(old, "", false, v1.EventTypeNormal, reasonUpdatePulled, fmt.Sprintf(
			"Successfully pulled image %q for the pod's new version (uid %s) in %s", r.ref, pod.UID, w.env.clock.Since(began).Round(time.Millisecond)))
	}
	return img, err
}

// holdPulls holds the pulls under key back by the kubelet's image backoff
// (10 s doubling to 5 min, every failure counting) and returns the wait.
func (w *podWorker) holdPulls(key string) time.Duration {
	b := w.st.backoff["pull:"+key]
	if b == nil {
		b = &backoff{delay: backoffInitial}
		w.st.backoff["pull:"+key] = b
	}
	b.forID = ""
	now := w.env.clock.Now()
	wait := b.waitFor("pull", now, now)
	if w.st.pullUntil == nil {
		w.st.pullUntil = map[string]time.Time{}
	}
	w.st.pullUntil[key] = now.Add(wait)
	return wait
}
