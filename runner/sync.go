package runner

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/noderun/noderun/internal/atomicfile"
	"github.com/noderun/noderun/internal/bandwidth"
	"github.com/noderun/noderun/runner/volume"
)

// sync brings one pod to its spec, the way the kubelet's SyncPod does:
// sandbox first, then init containers one by one, then app containers, each
// restarted per restartPolicy with crash backoff. It returns when the worker
// should look again even if nothing wakes it (0: only on events).
func (w *podWorker) sync(ctx context.Context, pod *v1.Pod) (retry time.Duration) {
	e := w.env
	if o := w.shutdownOrdered(); o != nil {
		return w.syncShutdown(ctx, pod, o)
	}
	if old := w.board.replacement(pod.UID); old != nil {
		after, done := w.pullAhead(ctx, pod, old)
		if !done {
			return after
		}
		w.board.imagesPulled(pod.UID)
	}
	if w.board.terminatingSibling(pod) {
		w.publish(pod, nil, podActions{initDone: len(pod.Spec.InitContainers) == 0})
		return 0
	}
	if !w.st.persisted {
		// Bookkeeping never holds supervision up (a full disk, an SD card
		// remounted read-only): the write, fsync and all, goes on beside
		// the sync, and is retried on a later sync if it failed.
		persisted := w.persist(pod)
		defer func() {
			if err := <-persisted; err != nil {
				e.log.Error("save pod state; supervising the pod anyway", "pod", podRef(pod), "err", err)
				retry = minPositive(retry, w.failDelay("persist"))
			} else {
				w.st.persisted = true
				delete(w.st.backoff, "persist")
			}
		}()
	}
	if w.st.sandboxOK {
		w.checkSandbox(ctx, pod)
	} else if after, done := w.syncWithoutSandbox(ctx, pod); done {
		return minPositive(retry, after)
	}
	defer w.prunePrecreated(ctx, pod)
	defer func() { w.st.listedEmpty = false }() // for this sync only
	if !w.st.sandboxOK {
		if err := w.ensureSandbox(ctx, pod); err != nil {
			w.st.netErr = err
			e.log.Error("pod sandbox", "pod", podRef(pod), "err", err)
			w.sandboxFailed(pod, err)
			w.publish(pod, nil, podActions{initDone: len(pod.Spec.InitContainers) == 0})
			return minPositive(retry, w.failDelay("sandbox"))
		}
		w.st.netErr = nil
		delete(w.st.backoff, "sandbox")
	} else {
		w.refreshConfigVolumes(pod)
	}
	latest, ok := w.observe(ctx, pod)
	if !ok {
		return minPositive(retry, w.failDelay("list"))
	}
	delete(w.st.backoff, "list")
	acts := computePodActions(w.view(pod, latest))
	if acts.resetAll {
		w.publish(pod, latest, acts) // AllContainersRestarting while they go
		retry = minPositive(retry, w.resetAll(ctx, pod, acts, latest))
		acts.resetAll, acts.initDone = false, false
		w.publish(pod, latest, acts)
		return retry
	}
	if len(acts.start) == 0 && !anyLive(latest) {
		// The pod has ended (or is failing for good): what was
		// precreated for later will not start.
		w.discardPrecreated(ctx)
	}
	if acts.failed == reasonDeadlineExceeded && len(acts.kill) > 0 {
		w.event(pod, "", false, v1.EventTypeNormal, reasonDeadlineExceeded, "Pod was active on the node longer than the specified deadline")
	}
	retry = minPositive(retry, w.act(ctx, pod, acts, latest))
	if acts.failed == "" && !w.view(pod, latest).ended() {
		retry = minPositive(retry, w.startEphemeral(ctx, pod, latest))
	}
	if acts.unknown {
		retry = minPositive(retry, w.failDelay("unknown"))
	} else {
		delete(w.st.backoff, "unknown")
	}
	st := w.publish(pod, latest, acts)
	if (st.Phase == v1.PodSucceeded || st.Phase == v1.PodFailed) && !anyLive(latest) {
		w.podEnded(ctx, pod)
	}
	retry = minPositive(retry, w.watchRollout(pod, st))
	if !acts.deadline.IsZero() && acts.failed == "" {
		retry = minPositive(retry, max(acts.deadline.Sub(e.clock.Now()), time.Millisecond))
	}
	return retry
}

// observe lists the pod's containers, keeps the newest run of each name and
// tells the prober which runs are live.
func (w *podWorker) observe(ctx context.Context, pod *v1.Pod) (map[string]*ContainerStatus, bool) {
	var cs []ContainerStatus
	if !w.st.listedEmpty {
		var err error
		if cs, err = w.env.rt.ListContainers(ctx, string(pod.UID)); err != nil {
			// containerd is down or restarting: back off, do not hammer it.
			w.env.log.Error("list containers", "pod", podRef(pod), "err", err)
			return nil, false
		}
	}
	latest := w.newestByName(ctx, w.hidePrecreated(cs))
	for name, failed := range w.st.startErr {
		if run := latest[name]; run == nil || run.RestartCount < failed.RestartCount {
			latest[name] = failed
		}
	}
	w.env.probes.SetPod(pod, w.probeIP(pod))
	for _, c := range allContainers(pod) {
		id, at := "", time.Time{}
		if run := latest[c.Name]; run != nil && run.State == StateRunning && (run.Sandbox == "" || run.Sandbox == w.st.epoch) {
			id, at = run.ID, run.CreatedAt
		}
		w.env.probes.SetContainer(pod.UID, c.Name, id, at)
	}
	return latest, true
}

func (w *podWorker) view(pod *v1.Pod, latest map[string]*ContainerStatus) podView {
	return podView{pod: pod, now: w.env.clock.Now(), started: w.st.started, epoch: w.st.epoch, runs: latest,
		probes: probeResults{w.env.probes, pod.UID}}
}

// newestByName keeps each container name's highest restart and removes the
// rest (left when noderun died between starting a replacement and removing
// the old one).
func (w *podWorker) newestByName(ctx context.Context, cs []ContainerStatus) map[string]*ContainerStatus {
	latest := map[string]*ContainerStatus{}
	for i := range cs {
		c := &cs[i]
		if old := latest[c.Name]; old == nil || c.RestartCount > old.RestartCount {
			latest[c.Name] = c
		}
	}
	for i := range cs {
		if latest[cs[i].Name].ID != cs[i].ID {
			w.remove(ctx, cs[i].ID)
		}
	}
	return latest
}

func (w *podWorker) remove(ctx context.Context, id string) {
	if err := w.env.rt.RemoveContainer(ctx, id); err != nil {
		w.env.log.Warn("remove container", "container", id, "err", err)
	}
}

// act carries out the decision: stops first, then starts, each start held
// back by its crash backoff. It returns when to look again.
func (w *podWorker) act(ctx context.Context, pod *v1.Pod, acts podActions, latest map[string]*ContainerStatus) time.Duration {
	if len(acts.kill) > 0 {
		w.killAll(ctx, pod, acts.kill)
		if fresh, ok := w.observeAfterKill(ctx, pod); ok {
			maps.Copy(latest, fresh)
		}
	}
	var requeue time.Duration
	for _, s := range acts.start {
		if run := latest[s.c.Name]; run != nil && (run.State == StateRunning || run.State == StateUnknown) {
			// A kill above did not take, or its shim does not answer:
			// never a second instance; the next sync sees it.
			requeue = minPositive(requeue, w.failDelay("unknown"))
			continue
		}
		if cur := latest[s.c.Name]; cur != nil {
			s.prev = cur // as it is after the kills
		}
		d := w.startOrWait(ctx, pod, s, latest)
		requeue = minPositive(requeue, d)
		if d > 0 && s.init && !isSidecar(s.c) {
			break
		}
	}
	return requeue
}

// killAll stops the given containers: app containers together, then init
// containers one by one in the order given (sidecars last-declared first).
func (w *podWorker) killAll(ctx context.Context, pod *v1.Pod, kills []killAction) {
	var wg sync.WaitGroup
	for _, k := range kills {
		if !k.init {
			wg.Add(1)
			go func() {
				defer wg.Done()
				w.killContainer(ctx, pod, k)
			}()
		}
	}
	wg.Wait()
	for _, k := range kills {
		if k.init {
			w.killContainer(ctx, pod, k)
		}
	}
}

func (w *podWorker) observeAfterKill(ctx context.Context, pod *v1.Pod) (map[string]*ContainerStatus, bool) {
	cs, err := w.env.rt.ListContainers(ctx, string(pod.UID))
	if err != nil {
		return nil, false
	}
	cs = w.hidePrecreated(cs)
	out := map[string]*ContainerStatus{}
	for i := range cs {
		if old := out[cs[i].Name]; old == nil || cs[i].RestartCount > old.RestartCount {
			out[cs[i].Name] = &cs[i]
		}
	}
	return out, true
}

// startOrWait starts a container unless its crash backoff since prev's exit
// has not passed; it returns how long until it may.
func (w *podWorker) startOrWait(ctx context.Context, pod *v1.Pod, s startAction, latest map[string]*ContainerStatus) time.Duration {
	prev := s.prev
	if prev == nil {
		if n, ok := w.st.reset[s.c.Name]; ok {
			// Removed by RestartAllContainers: no backoff, the count goes on.
			return w.start(ctx, pod, s, n, resetLastState(), latest)
		}
		return w.start(ctx, pod, s, 0, nil, latest)
	}
	if prev.State == StateCreated {
		// Made but never started (noderun stopped in between, e.g. while
		// it waited its turn, precreated): not a run that ended, so it
		// keeps its restart count, as the kubelet starts a Created
		// container; it is made anew under the same id.
		return w.start(ctx, pod, s, prev.RestartCount, prev.LastState, latest)
	}
	if prev.State == StateExited || prev.State == StateCreated {
		b := w.st.backoff[s.c.Name]
		if b == nil {
			b = crashBackoff(w.env.cfg.CrashLoopMaxBackoff)
			w.st.backoff[s.c.Name] = b
		}
		finished := prev.FinishedAt
		if finished.IsZero() {
			finished = prev.CreatedAt
		}
		now := w.env.clock.Now()
		wait := b.waitFor(prev.ID, finished, now)
		if left := b.until.Sub(now); left > 0 {
			w.st.waiting[s.c.Name] = waitReason{"CrashLoopBackOff", fmt.Sprintf(
				"back-off %s restarting failed container=%s pod=%s_%s(%s)", wait, s.c.Name, pod.Name, pod.Namespace, pod.UID)}
			w.event(pod, s.c.Name, s.init, v1.EventTypeWarning, "BackOff", "Back-off restarting failed container "+s.c.Name+" in pod "+pod.Name+"_"+pod.Namespace+"("+string(pod.UID)+")")
			return left
		}
	}
	return w.start(ctx, pod, s, prev.RestartCount+1, w.terminated(pod, s.c, prev), latest)
}

// start pulls the image if needed, creates and starts the container, runs
// its postStart hook, and removes the run it replaces.
func (w *podWorker) start(ctx context.Context, pod *v1.Pod, s startAction, restart int, last *v1.ContainerStateTerminated, latest map[string]*ContainerStatus) time.Duration {
	e, c := w.env, s.c
	img, retry, ok := w.startImage(ctx, pod, s)
	if !ok {
		return retry
	}
	cfg, err := w.containerConfig(pod, c, s.init, img, restart, last)
	if err != nil {
		return w.startFailed(pod, c, "CreateContainerConfigError", err)
	}
	cfg.TargetPID = s.targetPID
	var started Started
	if pc := w.takePrecreated(ctx, cfg); pc != nil {
		started, err = pc.Start(ctx)
	} else {
		started, err = e.rt.StartContainer(ctx, cfg)
	}
	// What this run is, whether it started or not.
	run := &ContainerStatus{
		ID: cfg.ID, PodUID: string(pod.UID), Name: c.Name, Init: s.init, SpecHash: cfg.SpecHash,
		RestartCount: restart, ImageRef: img.Ref, ImageID: img.ID, LastState: last, Sandbox: w.st.epoch,
	}
	if err != nil {
		return w.runFailed(ctx, pod, c, run, latest, err)
	}
	run.State, run.CreatedAt, run.User = StateRunning, started.At, started.User
	w.started(ctx, pod, s, run, latest)
	if h := postStart(c); h != nil {
		if err := w.runHook(ctx, pod, c, run.ID, h); err != nil {
			return w.postStartFailed(ctx, pod, s, run, latest, err)
		}
	}
	// Probes begin once the container counts as running: after postStart.
	e.probes.SetContainer(pod.UID, c.Name, run.ID, run.CreatedAt)
	if s.init && isSidecar(c) {
		w.poke() // the next init container may start once this one runs
	}
	return 0
}

// startImage finds the image start runs, unless the pull backoff holds it
// or the check fails: then ok is false and retry says when to try again.
func (w *podWorker) startImage(ctx context.Context, pod *v1.Pod, s startAction) (img ImageConfig, retry time.Duration, ok bool) {
	e, c := w.env, s.c
	if left := w.st.pullUntil[c.Name].Sub(e.clock.Now()); left > 0 {
		// Between pull attempts, as the kubelet says it.
		msg := fmt.Sprintf("Back-off pulling image %q", c.Image)
		w.st.waiting[c.Name] = waitReason{"ImagePullBackOff", msg}
		w.event(pod, c.Name, s.init, v1.EventTypeNormal, "BackOff", msg)
		return img, left, false
	}
	t0 := e.clock.Now()
	var err error
	if p := w.st.precreated[c.Name]; p != nil {
		// Found at hand when it was created, moments ago, and never
		// pulled (precreation skips pullPolicy Always): as a check now
		// would find it.
		img = p.cfg.Image
	} else if p, ok := w.st.pulledAhead[c.Name]; ok {
		// Pulled ahead while the old version ran (update.go), moments
		// ago: its first start pulls no more, even with policy Always.
		img = p
		delete(w.st.pulledAhead, c.Name)
	} else {
		img, err = w.ensureImage(ctx, pod, c, s.init)
	}
	e.log.Debug("image checked", "pod", podRef(pod), "container", c.Name, "took", e.clock.Since(t0))
	if errors.Is(err, ErrImageImporting) {
		w.st.waiting[c.Name] = waitReason{"ImageImporting", err.Error()}
		return img, 500 * time.Millisecond, false
	}
	if err != nil {
		return img, w.pullFailed(pod, c, s.init, err), false
	}
	if img.PullFallback != "" {
		w.event(pod, c.Name, s.init, v1.EventTypeWarning, "PullFallbackLocal",
			fmt.Sprintf("registry unreachable, running the local copy of %s (--image-pull-fallback=never refuses): %s", img.Ref, img.PullFallback))
	}
	return img, 0, true
}

// runFailed handles a container the runtime could not start and returns
// when to try again.
func (w *podWorker) runFailed(ctx context.Context, pod *v1.Pod, c *v1.Container, run *ContainerStatus, latest map[string]*ContainerStatus, err error) time.Duration {
	reason := startReason(err)
	if reason == "RunContainerError" && ctx.Err() == nil {
		// The runtime could not run it (no such binary...): that run
		// ended, as under CRI, with StartError and exit code 128.
		now := w.env.clock.Now()
		run.State, run.ExitCode, run.Reason, run.Message = StateExited, 128, "StartError", err.Error()
		run.CreatedAt, run.FinishedAt = now, now
		w.st.startErr[c.Name] = run
		latest[c.Name] = run
		// That run ended; the crash backoff decides the next one
		// (shown as CrashLoopBackOff), as after any exit.
		w.startFailed(pod, c, reason, err)
		return time.Second
	}
	return w.startFailed(pod, c, reason, err)
}

// started records run, now running, in place of the run it replaces,
// which it removes, and clears the container's backoffs.
func (w *podWorker) started(ctx context.Context, pod *v1.Pod, s startAction, run *ContainerStatus, latest map[string]*ContainerStatus) {
	c, restart := s.c, run.RestartCount
	delete(w.st.waiting, c.Name)
	delete(w.st.startErr, c.Name)
	delete(w.st.backoff, "start:"+c.Name)
	delete(w.st.backoff, "pull:"+c.Name)
	delete(w.st.pullUntil, c.Name)
	delete(w.st.reset, c.Name)
	old := latest[c.Name]
	latest[c.Name] = run
	if old != nil && old.ID != run.ID {
		w.remove(ctx, old.ID)
	}
	w.forgetOldRuns(c.Name, restart)
	w.pruneLogs(pod, c.Name, restart)
	w.env.log.Info("started container", "pod", podRef(pod), "container", c.Name, "restarts", restart)
	w.event(pod, c.Name, s.init, v1.EventTypeNormal, "Created", "Created container "+c.Name)
	w.event(pod, c.Name, s.init, v1.EventTypeNormal, "Started", "Started container "+c.Name)
}

// postStartFailed kills run, whose postStart hook failed, and returns when
// to start it again.
func (w *podWorker) postStartFailed(ctx context.Context, pod *v1.Pod, s startAction, run *ContainerStatus, latest map[string]*ContainerStatus, err error) time.Duration {
	c := s.c
	msg := err.Error() // the kubelet's event carries the hook's message alone
	w.event(pod, c.Name, s.init, v1.EventTypeWarning, "FailedPostStartHook", msg)
	w.st.waiting[c.Name] = waitReason{"PostStartHookError", msg}
	w.killContainer(ctx, pod, killAction{c: c, init: s.init, run: run, message: msg, grace: podGrace(pod)})
	run.State, run.FinishedAt = StateExited, w.env.clock.Now()
	if fresh, ok := w.observeAfterKill(ctx, pod); ok && fresh[c.Name] != nil {
		latest[c.Name] = fresh[c.Name]
	}
	return w.failDelay("start:" + c.Name)
}

// ensureImage gets the container's image per its pull policy, recording
// Pulling and Pulled (with size and time) when the runtime pulls.
func (w *podWorker) ensureImage(ctx context.Context, pod *v1.Pod, c *v1.Container, init bool) (ImageConfig, error) {
	var began time.Time
	trace := &PullTrace{Start: func(ref string) {
		began = w.env.clock.Now()
		w.event(pod, c.Name, init, v1.EventTypeNormal, "Pulling", fmt.Sprintf("Pulling image %q", c.Image))
	}}
	img, err := w.env.rt.EnsureImage(WithPullTrace(ctx, trace), c.Image, c.ImagePullPolicy)
	if err == nil && !began.IsZero() && img.PullFallback == "" {
		took := w.env.clock.Since(began).Round(time.Millisecond)
		msg := fmt.Sprintf("Successfully pulled image %q in %s", c.Image, took)
		if img.Size > 0 {
			msg += fmt.Sprintf(". Image size: %d bytes.", img.Size)
		}
		w.event(pod, c.Name, init, v1.EventTypeNormal, "Pulled", msg)
	}
	return img, err
}

// pullFailed reports an image that could not be had and holds the next
// attempt back by the kubelet's image backoff (10 s doubling to 5 min).
func (w *podWorker) pullFailed(pod *v1.Pod, c *v1.Container, init bool, err error) time.Duration {
	reason := "ErrImagePull"
	switch {
	case errors.Is(err, ErrImageNeverPull):
		reason = "ErrImageNeverPull"
	case errors.Is(err, ErrInvalidImageName):
		reason = "InvalidImageName"
	}
	w.env.log.Warn("image not available", "pod", podRef(pod), "container", c.Name, "reason", reason, "err", err)
	w.st.waiting[c.Name] = waitReason{reason, err.Error()}
	w.event(pod, c.Name, init, v1.EventTypeWarning, "Failed", fmt.Sprintf("Failed to pull image %q: %v", c.Image, err))
	wait := w.holdPulls(c.Name)
	// Look again soon, so the status turns to ImagePullBackOff.
	return min(wait, time.Second)
}

// startReason is the waiting reason for a failed StartContainer.
func startReason(err error) string {
	if errors.Is(err, ErrContainerConfig) {
		return "CreateContainerConfigError"
	}
	return "RunContainerError"
}

func (w *podWorker) startFailed(pod *v1.Pod, c *v1.Container, reason string, err error) time.Duration {
	w.env.log.Warn("container start failed", "pod", podRef(pod), "container", c.Name, "reason", reason, "err", err)
	w.st.waiting[c.Name] = waitReason{reason, err.Error()}
	w.event(pod, c.Name, isInit(pod, c.Name), v1.EventTypeWarning, "Failed", "Error: "+err.Error())
	return w.failDelay("start:" + c.Name)
}

// failDelay is the retry delay after another failure of the named step:
// 1 s, then the crash backoff's 10 s doubling to 5 min.
func (w *podWorker) failDelay(step string) time.Duration {
	b := w.st.backoff[step]
	if b == nil {
		b = &backoff{}
		w.st.backoff[step] = b
	}
	b.forID = "" // every failure counts, so retries slow down
	now := w.env.clock.Now()
	return max(b.waitFor(step, now, now), time.Second)
}

func minPositive(a, b time.Duration) time.Duration {
	if a <= 0 || (b > 0 && b < a) {
		return b
	}
	return a
}

// terminate stops every container of the pod in parallel, then removes them,
// the network, volumes and the pod's directories. Each step is idempotent so
// a crash half-way is repaired by running it again.
func (w *podWorker) terminate(ctx context.Context, pod *v1.Pod) error {
	e := w.env
	w.discardPrecreated(ctx)
	cs := w.stopAll(ctx, pod)
	w.env.probes.RemovePod(w.uid)
	if pod != nil && pod.UID == "" {
		pod.UID = w.uid
	}
	// The processes are gone: their containers and the network are
	// released together (a CNI DEL takes as long as a container removal).
	errs := make([]error, len(cs)+1)
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = e.rt.RemoveContainer(ctx, c.ID)
		}()
	}
	errs[len(cs)] = e.net.Teardown(ctx, w.sandbox(pod))
	wg.Wait()
	errs = append(errs, volume.UnmountAll(w.podStateDir()), RemovePodFiles(w.podRunDir()), volume.UnmountAll(w.podRunDir()))
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := w.removeCgroup(ctx); err != nil {
		e.log.Warn("pod cgroup not removed", "pod", podRef(pod), "err", err)
	}
	// Nothing is mounted below them now; should a mount remain, its
	// removal stops there rather than delete what it shows.
	errs = append(errs,
		volume.RemoveOnMount(w.podStateDir()),
		volume.RemoveOnMount(w.podRunDir()))
	for _, dir := range w.podLogDirs() {
		errs = append(errs, volume.RemoveOnMount(dir))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	e.log.Info("pod removed", "pod", podRef(pod), "uid", w.uid)
	return nil
}

func (w *podWorker) podStateDir() string { return podStateDir(w.env.cfg.StateDir, string(w.uid)) }

func podStateDir(stateDir, uid string) string { return filepath.Join(stateDir, "pods", uid) }

func (w *podWorker) podRunDir() string {
	return SandboxDir(w.env.cfg.RunDir, string(w.uid))
}

func (w *podWorker) podLogDir(pod *v1.Pod) string {
	return filepath.Join(w.env.cfg.PodLogDir, fmt.Sprintf("%s_%s_%s", pod.Namespace, pod.Name, w.uid))
}

// podLogDirs finds the pod's log directories by UID alone, so an orphan
// known by nothing else loses its logs too.
func (w *podWorker) podLogDirs() []string {
	ents, _ := os.ReadDir(w.env.cfg.PodLogDir)
	var out []string
	for _, d := range ents {
		// <namespace>_<name>_<uid>: the first two hold no "_", a UID may.
		if parts := strings.SplitN(d.Name(), "_", 3); d.IsDir() && len(parts) == 3 && parts[2] == string(w.uid) {
			out = append(out, filepath.Join(w.env.cfg.PodLogDir, d.Name()))
		}
	}
	return out
}

func (w *podWorker) sandbox(pod *v1.Pod) *Sandbox {
	return &Sandbox{
		ID:               SandboxID(string(w.uid)),
		PodUID:           string(w.uid),
		PodName:          pod.Name,
		Namespace:        pod.Namespace,
		Hostname:         utsHostname(pod),
		HostNetwork:      pod.Spec.HostNetwork,
		HostPID:          pod.Spec.HostPID,
		HostIPC:          pod.Spec.HostIPC,
		SharePID:         pod.Spec.ShareProcessNamespace != nil && *pod.Spec.ShareProcessNamespace,
		Dir:              w.podRunDir(),
		NSHolder:         w.env.cfg.NSHolder,
		Epoch:            w.st.epoch,
		Ports:            hostPorts(pod),
		IngressBandwidth: pod.Annotations[bandwidth.IngressAnnotation],
		EgressBandwidth:  pod.Annotations[bandwidth.EgressAnnotation],
	}
}

func hostPorts(pod *v1.Pod) []PortMapping {
	var out []PortMapping
	for _, c := range allContainers(pod) {
		for _, p := range c.Ports {
			if p.HostPort > 0 {
				out = append(out, PortMapping{HostPort: int(p.HostPort), ContainerPort: int(p.ContainerPort),
					Protocol: string(p.Protocol), HostIP: p.HostIP})
			}
		}
	}
	return out
}

// syncWithoutSandbox keeps a pod whose sandbox is gone (a reboot emptied
// the run dir) and that will run nothing again as it ended, without a new
// sandbox, as the kubelet does: its containers' statuses stay, no IP is
// taken (the old one is released), nothing starts. done is false when the
// sandbox is to be made.
func (w *podWorker) syncWithoutSandbox(ctx context.Context, pod *v1.Pod) (retry time.Duration, done bool) {
	if w.st.epoch != "" {
		return 0, false // this worker made it: it broke, and is made anew
	}
	if _, err := os.Stat(filepath.Join(w.podRunDir(), epochFile)); !errors.Is(err, fs.ErrNotExist) {
		return 0, false // adopted from the noderun before
	}
	latest, ok := w.observe(ctx, pod)
	if !ok {
		return w.failDelay("list"), true
	}
	delete(w.st.backoff, "list")
	v := w.view(pod, latest)
	if needsSandbox(v) {
		return 0, false
	}
	acts := computePodActions(v)
	acts.start = nil // the kubelet's KillPod without CreateSandbox
	retry = w.act(ctx, pod, acts, latest)
	if !w.st.oldReleased {
		// The kubelet's KillPod stops the old sandbox too: its IP and
		// host port rules are released.
		if err := w.env.net.Teardown(ctx, w.sandbox(pod)); err != nil {
			w.env.log.Error("release the network of the sandbox gone with a reboot", "pod", podRef(pod), "err", err)
			retry = minPositive(retry, w.failDelay("sandbox"))
		} else {
			w.st.oldReleased = true
			delete(w.st.backoff, "sandbox")
		}
	}
	if acts.unknown {
		retry = minPositive(retry, w.failDelay("unknown"))
	}
	st := w.publish(pod, latest, acts)
	if (st.Phase == v1.PodSucceeded || st.Phase == v1.PodFailed) && !anyLive(latest) {
		w.podEnded(ctx, pod)
	}
	return retry, true
}

// ensureSandbox sets up namespaces, network, pod files and volumes. A
// sandbox found from an earlier noderun is checked deeply once; containers
// left running in a sandbox that had to be made anew are stopped, so they
// restart (per restartPolicy) inside the new one, as the kubelet does.
func (w *podWorker) ensureSandbox(ctx context.Context, pod *v1.Pod) error {
	if _, err := kernelHostname(pod); err != nil && !pod.Spec.HostNetwork {
		return err
	}
	resolv, err := resolvConfig(pod, w.env.cfg.ResolvConf)
	if err != nil {
		return err
	}
	if err := w.ensureCgroup(ctx, pod); err != nil {
		return err
	}
	sb := w.sandbox(pod)
	sb.DNS = resolv
	w.env.log.Debug("setting up the pod sandbox", "pod", podRef(pod))
	r, epoch, noRuns := w.setupOverlapped(ctx, pod, sb, resolv)
	ips, fresh, err := r.ips, r.fresh, r.err
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	if !fresh && !pod.Spec.HostNetwork {
		err := w.env.net.Check(ctx, sb, true)
		w.networkCheckFailed(ctx, pod, err)
		if errors.Is(err, ErrSandboxBroken) {
			w.env.log.Warn("adopted pod sandbox is broken; recreating it", "pod", podRef(pod), "err", err)
			// Containers precreated in the old netns must not start.
			w.discardPrecreated(ctx)
			epoch = ""
			if err := w.env.net.Teardown(ctx, sb); err != nil {
				return fmt.Errorf("network teardown: %w", err)
			}
			if ips, fresh, err = w.env.net.Setup(ctx, sb); err != nil {
				return fmt.Errorf("network: %w", err)
			}
		}
	}
	if fresh && !noRuns { // only this worker makes the pod's containers
		w.stopAll(ctx, pod)
	}
	switch {
	case r.epochErr != nil:
		return r.epochErr
	case r.epoch != "": // recorded beside the network set-up
		w.st.epoch = r.epoch
	default:
		if w.st.epoch, err = sandboxEpoch(w.podRunDir(), fresh, epoch); err != nil {
			return err
		}
	}
	w.st.checked = w.env.clock.Now()
	w.st.ips = ips
	if err := w.writePodFiles(pod, resolv); err != nil {
		return err
	}
	rev := w.env.objects.revision()
	if err := w.setupVolumes(pod); err != nil {
		return fmt.Errorf("%w: %w", errVolumeSetup, err)
	}
	w.st.configRev = rev
	w.st.sandboxOK = true
	return nil
}

// checkSandbox verifies a running pod's network on every sync, cheaply
// except every NetworkCheck, and marks the sandbox for recreation when it
// broke underneath the pod.
func (w *podWorker) checkSandbox(ctx context.Context, pod *v1.Pod) {
	if pod.Spec.HostNetwork {
		return
	}
	every := w.env.cfg.NetworkCheck
	deep := every > 0 && w.env.clock.Since(w.st.checked) >= every
	if deep {
		w.st.checked = w.env.clock.Now()
	}
	err := w.env.net.Check(ctx, w.sandbox(pod), deep)
	w.networkCheckFailed(ctx, pod, err)
	if errors.Is(err, ErrSandboxBroken) {
		w.env.log.Warn("pod network broke; recreating the sandbox", "pod", podRef(pod), "err", err)
		if err := w.env.net.Teardown(ctx, w.sandbox(pod)); err != nil {
			w.env.log.Error("network teardown", "pod", podRef(pod), "err", err)
		}
		w.st.sandboxOK = false
	}
}

// reasonNetworkCheckFailed is the Warning event of a network check that
// failed without showing the sandbox broken, e.g. a plugin's CHECK failing
// for a reason of its own: the pod keeps its sandbox, since recreating it
// would restart the pod at every check for nothing.
const reasonNetworkCheckFailed = "NetworkCheckFailed"

// networkCheckFailed shows such a failure as an event, which folds repeats
// into a count, so it is logged once.
func (w *podWorker) networkCheckFailed(ctx context.Context, pod *v1.Pod, err error) {
	if err == nil || errors.Is(err, ErrSandboxBroken) || ctx.Err() != nil {
		return
	}
	w.event(pod, "", false, v1.EventTypeWarning, reasonNetworkCheckFailed, "Pod network check failed; the sandbox is kept: "+err.Error())
}

// stopAll stops the pod's running containers as the kubelet does at
// termination: app containers (and a running init container) together,
// then sidecars one by one, last declared first, within what is left of the
// grace period. Their exits then go through the normal restart logic.
func (w *podWorker) stopAll(ctx context.Context, pod *v1.Pod) []ContainerStatus {
	cs, err := w.env.rt.ListContainers(ctx, string(w.uid))
	if err != nil {
		w.env.log.Warn("list containers", "pod", podRef(pod), "err", err)
		return nil
	}
	grace := podGrace(pod)
	deadline := w.env.clock.Now().Add(grace)
	var kills []killAction
	sidecars := map[string]killAction{}
	for i := range cs {
		run := &cs[i]
		if run.State != StateRunning && run.State != StateUnknown {
			continue // an unknown one may be running: stop it too
		}
		c := specOf(pod, run.Name)
		if c == nil {
			c = &v1.Container{Name: run.Name} // an orphan known by labels only
		}
		k := killAction{c: c, init: run.Init, run: run, message: "Stopping container " + run.Name, grace: grace}
		if run.Init && isSidecar(c) {
			sidecars[c.Name] = k
			continue
		}
		k.init = false // stopped together with the app containers
		kills = append(kills, k)
	}
	w.killAll(ctx, pod, kills)
	inits := pod.Spec.InitContainers
	for i := len(inits) - 1; i >= 0; i-- {
		if k, ok := sidecars[inits[i].Name]; ok {
			k.grace = max(deadline.Sub(w.env.clock.Now()), minKillGrace)
			w.killContainer(ctx, pod, k)
		}
	}
	return cs
}

// persist records the pod on disk, so that after a noderun restart a pod
// whose manifest disappeared meanwhile is still torn down with its own spec,
// and the pod keeps its start time. The start time is known when it
// returns; the write's result comes on the channel.
func (w *podWorker) persist(pod *v1.Pod) <-chan error {
	if w.st.started.IsZero() {
		if prev, err := loadPod(w.env.cfg.StateDir, pod.UID); err == nil && prev.Status.StartTime != nil {
			w.st.started = prev.Status.StartTime.Time
		} else {
			w.st.started = w.env.clock.Now()
		}
	}
	done := make(chan error, 1)
	// The pod files and volumes go into the dir: it exists on return.
	dir := w.podStateDir()
	if err := os.MkdirAll(dir, 0o750); err != nil {
		done <- err
		return done
	}
	rec := pod.DeepCopy()
	rec.Status = v1.PodStatus{StartTime: &metav1.Time{Time: w.st.started}}
	go func() {
		b, err := json.Marshal(rec)
		if err == nil {
			err = atomicfile.WriteFile(filepath.Join(dir, "pod.json"), b, 0o640)
		}
		done <- err
	}()
	return done
}

// loadPod reads the spec a pod was last run with.
func loadPod(stateDir string, uid types.UID) (*v1.Pod, error) {
	b, err := os.ReadFile(filepath.Join(stateDir, "pods", string(uid), "pod.json"))
	if err != nil {
		return nil, err
	}
	var p v1.Pod
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// metaOf rebuilds a pod's identity from a container's labels.
func metaOf(c ContainerStatus) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: c.PodName, Namespace: c.PodNamespace, UID: types.UID(c.PodUID)}
}

const epochFile = "epoch"

// sandboxEpoch names the pod's current sandbox: a new name (want, if set)
// when it was just made, else the one recorded beside its namespaces (which
// a reboot clears). Containers carry it, so runs from a sandbox that is gone
// are told apart.
func sandboxEpoch(dir string, fresh bool, want string) (string, error) {
	path := filepath.Join(dir, epochFile)
	if !fresh {
		if b, err := os.ReadFile(path); err == nil && len(b) > 0 {
			return string(b), nil
		}
	}
	epoch := want
	if epoch == "" {
		epoch = rand.Text()[:12] // 60 random bits: never the old one
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("sandbox epoch: %w", err)
	}
	if err := atomicfile.WriteFile(path, []byte(epoch), 0o600); err != nil {
		return "", fmt.Errorf("sandbox epoch: %w", err)
	}
	return epoch, nil
}
