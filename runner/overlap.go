package runner

import (
	"context"
	"crypto/rand"
	"reflect"
	"sync"

	v1 "k8s.io/api/core/v1"
)

// A new pod's CNI ADD (the bridge plugin: a veth, an IP lease, iptables
// rules) and the creation of its containers (snapshot, spec, shim, runc
// create) need nothing from each other but the pinned namespaces. So while
// the network is attached, the pod's containers are created with their
// tasks, all at once, and each is only started when its turn comes (init
// containers one after another) and never before the network is up and the
// pod's IP known. Those not started yet are hidden from the pod's runs.
//
// What needs the IP is written before the start: the hosts file is
// rewritten in place (the container binds the file, not its name), and a
// container whose config comes out different once the IP is known (env or
// args naming status.podIP) is discarded and created anew. Pods whose
// sandbox holds more than namespaces at creation (a shared PID namespace,
// downwardAPI volumes, which a subPath may pin; image volumes, pulled and
// mounted at each start) take the plain path, as do
// pods with containers already in the runtime (adoption, a restart) and
// retries after a failed set-up.

// precreated is a container created ahead of its start.
type precreated struct {
	cfg     *ContainerConfig
	created CreatedContainer
}

type setupResult struct {
	ips   []string
	fresh bool
	err   error
	// epoch is the new sandbox's, recorded while the containers were
	// being created ("" when it is not: not fresh, or not overlapped).
	epoch    string
	epochErr error
}

// setupOverlapped runs the network's Setup and, meanwhile, creates the
// containers of a new pod into w.st.precreated. It returns Setup's results,
// the epoch a fresh sandbox gets (the one the precreated containers carry)
// or "" when nothing was precreated, and whether the pod was seen to have
// no containers at all before.
func (w *podWorker) setupOverlapped(ctx context.Context, pod *v1.Pod, sb *Sandbox, dns DNSConfig) (setupResult, string, bool) {
	if !w.mayPrecreate(pod) {
		ips, fresh, err := w.env.net.Setup(ctx, sb)
		return setupResult{ips: ips, fresh: fresh, err: err}, "", false
	}
	// The listing (a containerd round trip) needs no namespace, and the
	// containers' records need none either: only their tasks do.
	type listing struct {
		cs  []ContainerStatus
		err error
	}
	listed := make(chan listing, 1)
	go func() {
		cs, err := w.env.rt.ListContainers(ctx, string(pod.UID))
		listed <- listing{cs, err}
	}()
	images := w.imagesAtHand(ctx, pod)
	pinned := make(chan struct{})
	var pinErr error
	go func() {
		pinErr = w.env.net.Pin(ctx, sb)
		close(pinned)
	}()
	epoch := rand.Text()[:12] // as sandboxEpoch names a fresh sandbox
	done := make(chan setupResult, 1)
	go func() {
		<-pinned
		if pinErr != nil {
			done <- setupResult{}
			return
		}
		r := setupResult{}
		r.ips, r.fresh, r.err = w.env.net.Setup(ctx, sb)
		if r.err == nil && r.fresh {
			// Written here, while the containers are being created,
			// rather than after.
			r.epoch, r.epochErr = sandboxEpoch(sb.Dir, true, epoch)
		}
		done <- r
	}()
	t0 := w.env.clock.Now()
	l := <-listed
	imgs := images()
	none := l.err == nil && len(l.cs) == 0 && w.precreate(ctx, pod, dns, epoch, imgs, func() error {
		<-pinned
		return pinErr
	})
	made := w.env.clock.Since(t0)
	r := <-done
	if pinErr != nil {
		// Every task waited for the namespaces and its container was
		// removed; Setup makes them again and says what failed.
		w.st.listedEmpty = false
		ips, fresh, err := w.env.net.Setup(ctx, sb)
		return setupResult{ips: ips, fresh: fresh, err: err}, "", false
	}
	w.env.log.Debug("pod sandbox and first containers", "pod", podRef(pod), "precreated", len(w.st.precreated),
		"create", made, "network waited", w.env.clock.Since(t0)-made)
	return r, epoch, none
}

// mayPrecreate reports whether the pod's first containers may be created
// before its network is attached.
func (w *podWorker) mayPrecreate(pod *v1.Pod) bool {
	s := &pod.Spec
	// After a failed set-up, retries would create and remove containers
	// in a loop until the network works.
	if w.st.netErr != nil || s.HostNetwork || s.ShareProcessNamespace != nil && *s.ShareProcessNamespace {
		return false
	}
	for _, v := range s.Volumes {
		if v.DownwardAPI != nil || v.Projected != nil || v.Image != nil {
			return false
		}
	}
	return true
}

// precreate creates, in parallel, every container of a pod with no runs
// (init containers too: each then waits only for its start, not for its
// creation, once the one before it exited), in a sandbox of the given
// epoch, from the images imagesAtHand found; each task once pinned (the
// namespaces) returned nil. Whatever fails here is left for the normal start
// to do and report. It reports true: the pod has no containers but these,
// which the sync's listing then need not ask the runtime.
func (w *podWorker) precreate(ctx context.Context, pod *v1.Pod, dns DNSConfig, epoch string, imgs []*ImageConfig, pinned func() error) bool {
	w.st.listedEmpty = true
	// The bind sources must exist when the tasks are created, not before
	// the records; the hosts file gets the pod's IP in place once it is
	// known.
	files := make(chan error, 1)
	go func() {
		err := w.writePodFileData(pod, dns)
		if err == nil {
			err = w.setupVolumes(pod)
		}
		files <- err
	}()
	filesOnce := sync.OnceValue(func() error { return <-files })
	ready := func() error {
		if err := filesOnce(); err != nil {
			return err
		}
		return pinned()
	}
	defer filesOnce() // no goroutine outlives the sync
	prev := w.st.epoch
	w.st.epoch = epoch
	defer func() { w.st.epoch = prev }()
	var cfgs []*ContainerConfig
	for i, c := range allContainers(pod) {
		if imgs[i] == nil {
			continue
		}
		if cfg, err := w.containerConfig(pod, c, i < len(pod.Spec.InitContainers), *imgs[i], 0, nil); err == nil {
			cfgs = append(cfgs, cfg)
		}
	}
	made := make([]CreatedContainer, len(cfgs))
	var wg sync.WaitGroup
	for i, cfg := range cfgs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			made[i], _ = w.env.rt.CreateContainer(ctx, cfg, ready)
		}()
	}
	wg.Wait()
	for i, cfg := range cfgs {
		if made[i] != nil {
			if w.st.precreated == nil {
				w.st.precreated = map[string]*precreated{}
			}
			w.st.precreated[cfg.Container.Name] = &precreated{cfg, made[i]}
		}
	}
	return true
}

// imagesAtHand looks up, in the background, the image of each container
// precreate may create, by index in allContainers; the result waits for
// the lookups. Only images at hand (PullNever): a pull, its events and
// failures are the start's. Nothing here needs the pod's listing.
func (w *podWorker) imagesAtHand(ctx context.Context, pod *v1.Pod) func() []*ImageConfig {
	cs := allContainers(pod)
	imgs := make([]*ImageConfig, len(cs))
	var wg sync.WaitGroup
	for i, c := range cs {
		if c.ImagePullPolicy == v1.PullAlways || usesSubPath(c) {
			// A pull now and another at the start; a subPath bound now,
			// before an init container made what it names.
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if img, err := w.env.rt.EnsureImage(ctx, c.Image, v1.PullNever); err == nil {
				imgs[i] = &img
			}
		}()
	}
	return func() []*ImageConfig {
		wg.Wait()
		return imgs
	}
}

// takePrecreated returns the container precreated for cfg, if its config
// is still cfg; one that no longer fits is removed.
func (w *podWorker) takePrecreated(ctx context.Context, cfg *ContainerConfig) CreatedContainer {
	p := w.st.precreated[cfg.Container.Name]
	if p == nil {
		return nil
	}
	delete(w.st.precreated, cfg.Container.Name)
	if !sameConfig(p.cfg, cfg) {
		w.remove(ctx, p.cfg.ID)
		return nil
	}
	return p.created
}

// anyLive reports whether a run may be running.
func anyLive(runs map[string]*ContainerStatus) bool {
	for _, r := range runs {
		if r.State == StateRunning || r.State == StateUnknown {
			return true
		}
	}
	return false
}

func usesSubPath(c *v1.Container) bool {
	for _, m := range c.VolumeMounts {
		if m.SubPath != "" || m.SubPathExpr != "" {
			return true
		}
	}
	return false
}

// discardPrecreated removes the precreated containers not started yet.
func (w *podWorker) discardPrecreated(ctx context.Context) {
	for name, p := range w.st.precreated {
		w.remove(ctx, p.cfg.ID)
		delete(w.st.precreated, name)
	}
}

// prunePrecreated, after each sync, removes the precreated containers that
// can no longer start as made: their sandbox is gone or was not the fresh
// one, or their container left the spec or changed.
func (w *podWorker) prunePrecreated(ctx context.Context, pod *v1.Pod) {
	for name, p := range w.st.precreated {
		c := specOf(pod, name)
		if !w.st.sandboxOK || c == nil || p.cfg.SpecHash != specHash(c) || p.cfg.Sandbox.Epoch != w.st.epoch {
			w.remove(ctx, p.cfg.ID)
			delete(w.st.precreated, name)
		}
	}
}

// hidePrecreated drops the precreated containers from a listing: they are
// not runs yet, and a created task would otherwise count as one that never
// started.
func (w *podWorker) hidePrecreated(cs []ContainerStatus) []ContainerStatus {
	if len(w.st.precreated) == 0 {
		return cs
	}
	out := cs[:0:0]
	for _, c := range cs {
		if p := w.st.precreated[c.Name]; p == nil || p.cfg.ID != c.ID {
			out = append(out, c)
		}
	}
	return out
}

// sameConfig reports whether two configs of a container describe the same
// process: the sandbox by value, everything else deeply.
func sameConfig(a, b *ContainerConfig) bool {
	x, y := *a, *b
	if x.Sandbox == nil || y.Sandbox == nil {
		return x.Sandbox == y.Sandbox && reflect.DeepEqual(x, y)
	}
	sx, sy := *x.Sandbox, *y.Sandbox
	x.Sandbox, y.Sandbox = nil, nil
	return reflect.DeepEqual(sx, sy) && reflect.DeepEqual(x, y)
}
