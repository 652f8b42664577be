// Package runner is noderun's sync engine: it turns manifest snapshots into
// per-pod workers that drive a Runtime and a Network, and keeps pod status.
package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/noderun/noderun/internal/admission"
	"github.com/noderun/noderun/internal/cgroups"
	"github.com/noderun/noderun/manifests"
	"github.com/noderun/noderun/runner/prober"
)

// Config holds the engine's settings.
type Config struct {
	NodeName  string
	HostIP    string
	StateDir  string // pods' durable files: <StateDir>/pods/<uid>
	RunDir    string // pods' sandboxes: SandboxDir(RunDir, uid)
	NSHolder  string // where pods' ipc and uts namespaces are pinned (runner.Sandbox)
	PodLogDir string
	// RecursiveReadOnlyMounts: the runtime can make recursive read-only
	// mounts (volumeMounts' recursiveReadOnly), as CRI's runtime handler
	// features tell the kubelet.
	RecursiveReadOnlyMounts bool
	// UserNamespaces: the runtime can run pods in user namespaces of their
	// own (hostUsers: false), as CRI's runtime handler features tell the
	// kubelet; without, such pods are rejected at admission.
	UserNamespaces bool
	ResolvConf     string // the host resolv.conf that pods with dnsPolicy Default get
	// PodTmpfs puts each pod's /etc/hosts, /etc/hostname, /etc/resolv.conf
	// and termination-message files on a small tmpfs of its own
	// (PodFilesDir); off, they are plain files there (unit tests, which
	// may run without root).
	PodTmpfs bool
	Cgroups  cgroups.Layout // where pod cgroups are (zero: cgroupfs, /noderun)
	// PodCgroups makes each pod's cgroup with the kubelet's limits and
	// keeps the QoS parents' shares; off (unit tests), runc alone makes
	// the pods' cgroups, without limits, and the host's are left alone.
	PodCgroups bool
	// AllowedUnsafeSysctls are sysctls pods may set beyond the safe set:
	// names, or prefixes ending in "*".
	AllowedUnsafeSysctls []string
	// AppArmor says whether the host enforces AppArmor, read once at start
	// as the kubelet does; without it, a pod asking for a profile other
	// than Unconfined is rejected at admission (reason AppArmor).
	AppArmor bool
	// Node is this node as admission sees it: its name, labels and
	// status.allocatable, read when new pods arrive. Default: the kubelet's
	// well-known labels and no allocatable, so that resources are not
	// checked (tests of other parts).
	Node func() *v1.Node
	// MemoryCapacity is the machine's memory in bytes (MemTotal), from
	// which Burstable containers' oom_score_adj is computed, as the
	// kubelet does; 0: unknown (their score is 999).
	MemoryCapacity int64
	// SwapBehavior is the kubelet's memorySwap.swapBehavior: NoSwap ("" too)
	// or LimitedSwap; SwapCapacity is the machine's swap in bytes, which
	// LimitedSwap shares out.
	SwapBehavior string
	SwapCapacity int64
	// CrashLoopMaxBackoff caps the crash-loop backoff between a
	// container's restarts (the kubelet's
	// crashLoopBackOff.maxContainerRestartPeriod, 1 s to 300 s); 0: the
	// kubelet's default, 5 min.
	CrashLoopMaxBackoff time.Duration
	// Resync pokes every worker this often, a safety net for missed events.
	Resync time.Duration
	// GCInterval is how often network resources of unknown pods are released.
	GCInterval time.Duration
	// ImageGC is when unused images are removed; ImageGCPeriod how often
	// it is looked at (0: never).
	ImageGC       ImageGCPolicy
	ImageGCPeriod time.Duration
	// NetworkCheck is how often a running pod's network gets a CNI CHECK
	// (0: only after a noderun restart and when its interfaces vanish).
	NetworkCheck time.Duration
	// OnActivity runs (on a worker's goroutine; it must not block) when a
	// pod worker starts and when it finishes acting.
	OnActivity func()
	Logger     *slog.Logger
	Clock      clock.WithTicker // default: clock.RealClock

	// OnProbeResult, if set, is told every probe attempt's result as the
	// kubelet's prober_probe_total counts it (probeType Liveness,
	// Readiness or Startup; result successful, failed or unknown).
	OnProbeResult func(namespace, pod, podUID, container, probeType, result string)
	// Metrics, if set, is told of every runtime call.
	Metrics RuntimeMetrics
}

// Engine reconciles desired pods from sources against the runtime.
type Engine struct {
	cfg    Config
	rt     Runtime
	net    Network
	log    *slog.Logger
	clock  clock.WithTicker
	probes *prober.Manager
	events eventLog
	env    *podEnv // what workers get
	// changes counts status and event changes for the API's watches.
	changes changes

	mu      sync.Mutex
	sources map[string]manifests.Snapshot
	// conflicts holds, by source, the pods refused because another
	// source defines the same namespace/name or UID.
	conflicts      map[string][]error
	objectsChanged bool // since the last pokeForObjects
	workers        map[types.UID]*podWorker
	rejected       map[types.UID]rejection // by admission, see admitLocked
	shuttingDown   bool                    // the node shuts down (Shutdown): new pods are rejected
	holds          map[types.UID]hold      // waiting for dependencies, see holdLocked
	waitedOn       map[string]bool         // namespace/name of the pods held ones wait for
	depsChanged    chan struct{}           // one slot: a status held pods wait on changed
	// Download, then replace (update.go): new versions pulling their
	// images, with the old version's worker, and those done.
	replacing map[types.UID]*podWorker
	imagesIn  map[types.UID]bool
	// Rollback (rollback.go): by namespace/name, the last Ready version
	// and the version rolled back from; rolloutMu orders their writes.
	rollouts       map[string]*rollout
	rolloutMu      sync.Mutex
	rolloutChanged chan struct{} // one slot: a rollback to apply
	statuses       map[types.UID]*v1.Pod
	generations    map[types.UID]generation // of desired pods, see stampGenerationsLocked
	statusRev      uint64                   // the last stamp putStatusLocked gave a status
	counts         PodCounts                // of statuses
	countsChanged  chan struct{}            // one slot: the counts changed since the last read
	wg             sync.WaitGroup
	qosMu          sync.Mutex // one QoS parents' update at a time (updateQoS)

	// Touched only by Run's goroutine.
	settled, waitLogged bool                  // orphans removed; the wait for sources logged
	diskPods            map[types.UID]*v1.Pod // see readPodsOnDisk
	ready               atomic.Bool
	readyCh             chan struct{} // closed with ready set (Ready)
	// The main loop's last turn, read with its monotonic clock reading so
	// a wall-clock step does not change its age.
	lastLoop    atomic.Pointer[time.Time]
	imageGCBusy atomic.Bool // an image GC runs (off the loop)

	// While a network GC runs (off the loop), gcKeep is the set of sandbox
	// IDs it keeps and gcDone closes when it ends; both are nil otherwise.
	// Guarded by mu.
	gcKeep map[string]bool
	gcDone chan struct{}
	// netGCTimeout bounds a network GC, and so how long a new pod may wait
	// for one; what it did not get to is released by the next.
	netGCTimeout time.Duration
}

// New returns an engine; Run starts it.
func New(cfg Config, rt Runtime, net Network) *Engine {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Resync == 0 {
		cfg.Resync = time.Minute
	}
	if cfg.Node == nil {
		node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: cfg.NodeName, Labels: admission.NodeLabels(cfg.NodeName, nil)}}
		cfg.Node = func() *v1.Node { return node }
	}
	if cfg.GCInterval == 0 {
		cfg.GCInterval = 10 * time.Minute
	}
	if cfg.Metrics != nil {
		rt = instrumented{rt, cfg.Metrics}
	}
	e := &Engine{
		cfg: cfg, rt: rt, net: net, log: cfg.Logger, clock: cfg.Clock,
		sources:        map[string]manifests.Snapshot{},
		workers:        map[types.UID]*podWorker{},
		rejected:       map[types.UID]rejection{},
		holds:          map[types.UID]hold{},
		imagesIn:       map[types.UID]bool{},
		rollouts:       map[string]*rollout{},
		rolloutChanged: make(chan struct{}, 1),
		diskPods:       map[types.UID]*v1.Pod{},
		depsChanged:    make(chan struct{}, 1),
		statuses:       map[types.UID]*v1.Pod{},
		generations:    map[types.UID]generation{},
		countsChanged:  make(chan struct{}, 1),
		readyCh:        make(chan struct{}),
		// Room for two DELs or nat sweeps that hit cni's one-minute bound.
		netGCTimeout: 2 * time.Minute,
	}
	e.events.changed = e.changes.bump
	exec := execer(rt)
	e.probes = prober.NewManager(prober.Config{
		Exec:           exec,
		OnChange:       func(uid string) { e.poke(types.UID(uid)) },
		OnProbeFailure: e.probeFailed,
		OnProbeError: func(uid, container string, kind prober.Kind, err error) {
			e.unhealthy(uid, container, kind.String()+" probe errored: "+err.Error())
		},
		Clock: e.clock,

		OnResult: e.probeResult,
	})
	e.env = &podEnv{cfg: &e.cfg, rt: rt, net: net, probes: e.probes, execer: exec, events: &e.events, clock: e.clock, log: e.log,
		noSwap: cfg.PodCgroups && cfg.Cgroups.SwapControl(), objects: &configObjects{}}
	// As the kubelet: LimitedSwap only on v2 with the swap controller,
	// NoSwap elsewhere.
	e.env.limitedSwap = cfg.SwapBehavior == LimitedSwap && e.env.noSwap && cfg.Cgroups.Unified
	e.env.userns = newUsernsRanges()
	for _, uid := range e.podDirs() { // before any pod runs, as the kubelet's userns manager
		if err := e.env.userns.load(uid, podStateDir(cfg.StateDir, string(uid))); err != nil {
			e.log.Warn("a pod's user namespace range not read; its sandbox will fail until it is removed", "uid", uid, "err", err)
		}
	}
	return e
}

// markTerminating keeps the pod listed while it is torn down, with a
// deletionTimestamp as the API server sets it (kubectl shows Terminating).
func (e *Engine) markTerminating(uid types.UID, pod *v1.Pod, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	cur := e.statuses[uid]
	if cur != nil && cur.DeletionTimestamp != nil {
		return
	}
	out := pod.DeepCopy()
	if cur != nil {
		out = cur.DeepCopy()
	}
	ts := metav1.NewTime(now)
	out.DeletionTimestamp = &ts
	out.DeletionGracePeriodSeconds = pod.Spec.TerminationGracePeriodSeconds
	e.putStatusLocked(uid, out)
}

// probeFailed records a failed probe attempt as the kubelet's Unhealthy
// event (each attempt, also below the failure threshold).
func (e *Engine) probeFailed(uid, container string, kind prober.Kind, msg string) {
	e.unhealthy(uid, container, kind.String()+" probe failed: "+msg)
}

// unhealthy records an Unhealthy event for a container of pod uid.
func (e *Engine) unhealthy(uid, container, msg string) {
	e.mu.Lock()
	w := e.workers[types.UID(uid)]
	e.mu.Unlock()
	if w == nil {
		return
	}
	pod := w.lastPod()
	if pod == nil {
		return
	}
	e.events.record(pod, container, fieldOf(isInit(pod, container)), v1.EventTypeWarning, "Unhealthy", msg, e.clock.Now())
}

// Run consumes snapshots from nSources sources until ctx ends. The first
// reconcile waits until every source has reported once, so pods from a
// source that is merely slow are never mistaken for removed ones.
func (e *Engine) Run(ctx context.Context, snaps <-chan manifests.Snapshot, nSources int) error {
	e.loadRollouts()
	if err := e.awaitSources(ctx, snaps, nSources); err != nil {
		return err
	}
	exits, err := e.rt.Exits(ctx)
	if err != nil {
		return fmt.Errorf("subscribe to exits: %w", err)
	}
	e.apply(ctx)
	e.settle(ctx)
	// The loop's first turn counts from now: ready never shows before it.
	now := e.clock.Now()
	e.lastLoop.Store(&now)
	e.ready.Store(true)
	close(e.readyCh)
	e.loop(ctx, snaps, exits)
	return nil
}

// awaitSources takes snapshots until each of nSources sources has sent
// one, or ctx ends.
func (e *Engine) awaitSources(ctx context.Context, snaps <-chan manifests.Snapshot, nSources int) error {
	for len(e.sources) < nSources {
		select {
		case s := <-snaps:
			e.setSource(s)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// loop is Run once ready: it reconciles on each snapshot, exit and tick
// until ctx ends, then waits for the workers.
func (e *Engine) loop(ctx context.Context, snaps <-chan manifests.Snapshot, exits <-chan ExitEvent) {
	resync := e.clock.NewTicker(e.cfg.Resync)
	defer resync.Stop()
	gc := e.clock.NewTicker(e.cfg.GCInterval)
	defer gc.Stop()
	var imageGC <-chan time.Time
	if e.cfg.ImageGCPeriod > 0 {
		t := e.clock.NewTicker(e.cfg.ImageGCPeriod)
		defer t.Stop()
		imageGC = t.C()
	}
	// A broken exit stream is subscribed again after a backoff, without
	// holding up the loop: a stream that breaks at once (containerd gone)
	// must not turn into a busy loop.
	var resubscribe <-chan time.Time
	resubDelay := exitRetryMin
	for {
		now := e.clock.Now()
		e.lastLoop.Store(&now)
		select {
		case <-ctx.Done():
			e.wg.Wait()
			e.probes.Stop()
			return
		case s := <-snaps:
			e.setSource(s)
			e.apply(ctx)
			e.pokeForObjects()
			e.settle(ctx)
		case ev, ok := <-exits:
			if ok {
				resubDelay = exitRetryMin // the stream works
				if ev.PodUID == "" {
					e.pokeAll() // whose it is could not be read
				} else {
					e.poke(types.UID(ev.PodUID))
				}
				continue
			}
			exits, resubscribe = nil, e.clock.After(resubDelay)
			resubDelay = min(resubDelay*2, exitRetryMax)
		case <-resubscribe:
			ch, err := e.rt.Exits(ctx)
			if err != nil {
				e.log.Warn("exit events unavailable", "err", err, "retry", resubDelay)
				resubscribe = e.clock.After(resubDelay)
				resubDelay = min(resubDelay*2, exitRetryMax)
				continue
			}
			exits, resubscribe = ch, nil
			e.pokeAll() // exits may have been missed meanwhile
		case <-e.depsChanged:
			e.apply(ctx)
		case <-e.rolloutChanged:
			e.apply(ctx)
		case <-resync.C():
			e.pokeAll()
		case <-gc.C():
			if e.settled {
				e.gc(ctx)
			} else {
				e.settle(ctx)
			}
		case <-imageGC:
			e.gcImages(ctx)
		}
	}
}

// gc releases network resources that belong to no pod noderun knows, off
// the loop: it runs plugins and iptables, which may take up to their bounds
// in cni. One at a time. A worker started meanwhile for a sandbox not in its
// keep list waits for it to end (see startWorkerLocked), so GC never
// releases what a new sandbox with that ID has just been given.
func (e *Engine) gc(ctx context.Context) {
	e.mu.Lock()
	if e.gcDone != nil {
		e.mu.Unlock()
		return
	}
	keep := make(map[string]bool, len(e.workers))
	for uid := range e.workers {
		keep[SandboxID(string(uid))] = true
	}
	done := make(chan struct{})
	e.gcKeep, e.gcDone = keep, done
	e.mu.Unlock()
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		ctx, cancel := context.WithTimeout(ctx, e.netGCTimeout)
		defer cancel()
		if err := e.net.GC(ctx, keep); err != nil {
			e.log.Warn("network garbage collection", "err", err)
		}
		e.mu.Lock()
		e.gcKeep, e.gcDone = nil, nil
		e.mu.Unlock()
		close(done)
	}()
}

// gcImages removes unused images off the loop (it may take long), never
// an image a manifest names (a container's or an image volume's; running,
// failing or last good), nor one a
// rollback would run, or a container of noderun's uses; one at a time.
func (e *Engine) gcImages(ctx context.Context) {
	if !e.settled || !e.imageGCBusy.CompareAndSwap(false, true) {
		return
	}
	var keep []string
	e.mu.Lock()
	pods := make([]*v1.Pod, 0, len(e.rollouts))
	for _, r := range e.rollouts {
		pods = append(pods, r.Ready) // what a rollback would run
	}
	for _, s := range e.sources {
		pods = append(pods, s.Pods...)
	}
	for _, p := range pods {
		for _, c := range allContainers(p) {
			keep = append(keep, c.Image)
		}
		for _, v := range p.Spec.Volumes {
			if v.Image != nil {
				keep = append(keep, v.Image.Reference) // as the kubelet's handleImageVolumes
			}
		}
	}
	e.mu.Unlock()
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		defer e.imageGCBusy.Store(false)
		cs, err := e.rt.ListContainers(ctx, "")
		if err != nil {
			e.log.Warn("image garbage collection skipped: cannot tell which images are in use", "err", err)
			return
		}
		for _, c := range cs {
			if c.ImageRef != "" {
				keep = append(keep, c.ImageRef)
			}
		}
		if _, err := e.rt.GCImages(ctx, keep, e.cfg.ImageGC); err != nil {
			e.log.Warn("image garbage collection", "err", err)
		}
	}()
}

// NetworkChanged makes the worker of the pod with this sandbox ID (every
// worker, for "") look at its network now; the network layer calls it when a
// pod's veth vanishes or the CNI config changes.
func (e *Engine) NetworkChanged(sandboxID string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for uid, w := range e.workers {
		if sandboxID == "" || SandboxID(string(uid)) == sandboxID {
			w.poke()
		}
	}
}

// Bounds of the backoff between subscriptions to containerd's exit events.
const (
	exitRetryMin = 100 * time.Millisecond
	exitRetryMax = 10 * time.Second
)

// desired merges every source's pods. A namespace/name or UID defined by
// two sources runs once: the pod already running (or with state on disk,
// from before a noderun restart) keeps it, else the first source by name;
// the other is an error of its source in /manifests (both would share a
// hostname, host ports and hostPaths).
func (e *Engine) desired() map[types.UID]*v1.Pod {
	type candidate struct {
		source string
		pod    *v1.Pod
	}
	var cands []candidate
	ended, defined := map[string]bool{}, map[string]bool{}
	e.mu.Lock()
	for _, name := range slices.Sorted(maps.Keys(e.sources)) {
		for _, p := range e.sources[name].Pods {
			// The UID names directories noderun removes; sources refuse
			// unsafe ones, and this keeps any that slipped through away.
			if err := manifests.CheckUID(string(p.UID)); err != nil {
				e.log.Error("pod refused: unusable uid", "pod", podRef(p), "err", err)
				continue
			}
			defined[podRef(p)] = true
			cands = append(cands, candidate{name, e.versionToRunLocked(p, ended)})
		}
	}
	stale := len(ended) > 0
	for ref := range e.rollouts {
		stale = stale || !defined[ref] && e.settled
	}
	e.mu.Unlock()
	if stale {
		e.endRollbacks(ended, defined, e.settled)
	}
	// Running: a worker has it, or (after a noderun restart, before any
	// worker) it has state on disk.
	ran := map[types.UID]bool{}
	for _, uid := range e.podDirs() {
		ran[uid] = true
	}
	e.mu.Lock()
	slices.SortStableFunc(cands, func(a, b candidate) int {
		ra, rb := ran[a.pod.UID] || e.workers[a.pod.UID] != nil, ran[b.pod.UID] || e.workers[b.pod.UID] != nil
		switch {
		case ra && !rb:
			return -1
		case rb && !ra:
			return 1
		}
		return 0
	})
	e.mu.Unlock()
	out := map[types.UID]*v1.Pod{}
	byName, byUID := map[string]string{}, map[types.UID]string{} // -> source
	conflicts := map[string][]error{}
	for _, c := range cands {
		key := c.pod.Namespace + "/" + c.pod.Name
		first, dup := byName[key]
		if !dup {
			first, dup = byUID[c.pod.UID]
		}
		if dup {
			conflicts[c.source] = append(conflicts[c.source], e.conflict(c.source, c.pod, first))
			continue
		}
		byName[key], byUID[c.pod.UID], out[c.pod.UID] = c.source, c.source, c.pod
	}
	// Each source refuses its own pods that wait for each other; this
	// refuses those whose cycle spans sources.
	for uid, me := range manifests.DependencyErrors(slices.Collect(maps.Values(out)), false) {
		source := byUID[uid]
		e.locate(me, source, uid)
		conflicts[source] = append(conflicts[source], me)
		delete(out, uid)
	}
	e.mu.Lock()
	e.conflicts = conflicts
	e.mu.Unlock()
	return out
}

// conflict is the error shown for a pod that another source, first,
// already defines.
func (e *Engine) conflict(source string, p *v1.Pod, first string) error {
	me := &manifests.ManifestError{Field: "metadata.name",
		Message: fmt.Sprintf("pod %s/%s is already defined by source %s; this definition is not run", p.Namespace, p.Name, first)}
	e.locate(me, source, p.UID)
	return me
}

// locate points me at the file and line of source that define pod uid
// (at the source, when it does not say).
func (e *Engine) locate(me *manifests.ManifestError, source string, uid types.UID) {
	me.File = source
	for _, info := range e.sources[source].Info.Pods {
		if info.UID == uid && info.File != "" {
			me.File, me.Line = info.File, info.Line
		}
	}
}

// apply hands every desired pod that admission lets run to its worker and
// asks workers of pods no longer desired to kill them, but for an old
// version kept running while its replacement pulls images (update.go).
func (e *Engine) apply(ctx context.Context) {
	want := e.desired()
	ran := map[types.UID]bool{}
	for _, uid := range e.podDirs() {
		ran[uid] = true
	}
	e.readPodsOnDisk(want, ran)
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stampGenerationsLocked(want)
	run := e.admitLocked(want, ran)
	held := e.holdLocked(want, run)
	keep := e.gateLocked(ctx, run, held)
	for uid, pod := range run {
		if held[uid] {
			continue
		}
		w := e.workers[uid]
		if w == nil {
			w = e.startWorkerLocked(ctx, uid)
		}
		w.update(pod)
	}
	for uid, w := range e.workers {
		if _, ok := run[uid]; !ok && !keep[uid] {
			w.kill()
		}
	}
}

// removeOrphans kills what noderun left behind earlier: pods whose
// containers or state directory remain but that no source wants. Desired
// pods already have workers, which adopt their running containers.
func (e *Engine) removeOrphans(ctx context.Context) error {
	// On the loop: a containerd that hangs must not stall it (the
	// watchdog would restart noderun, which cannot help); settle retries.
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	existing, err := e.rt.ListContainers(lctx, "")
	if err != nil {
		return fmt.Errorf("list containers: %w", err)
	}
	orphans := map[types.UID]*v1.Pod{}
	for _, c := range existing {
		if uid := types.UID(c.PodUID); orphans[uid] == nil {
			orphans[uid] = &v1.Pod{ObjectMeta: metaOf(c)}
		}
	}
	for _, uid := range e.podDirs() {
		if p, err := loadPod(e.cfg.StateDir, uid); err == nil {
			orphans[uid] = p
		} else if orphans[uid] == nil {
			orphans[uid] = &v1.Pod{}
			orphans[uid].UID = uid
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for uid, pod := range orphans {
		if _, held := e.holds[uid]; e.workers[uid] != nil || held {
			continue // desired: a held pod's worker handles its leftovers once it starts
		}
		e.log.Info("removing pod left from an earlier run", "pod", pod.Namespace+"/"+pod.Name, "uid", uid)
		w := e.startWorkerLocked(ctx, uid)
		w.last = pod
		w.kill()
	}
	return nil
}

// settle removes orphans and collects network garbage, once: as soon as
// every source has read its manifests. Until then a running pod might belong
// to a source that could not answer yet (a URL at boot with no saved copy),
// and removing it, or releasing its IP, would be wrong.
func (e *Engine) settle(ctx context.Context) {
	if e.settled {
		return
	}
	e.mu.Lock()
	for name, s := range e.sources {
		if s.Unavailable {
			e.mu.Unlock()
			if !e.waitLogged {
				e.log.Info("not removing leftover pods until every source has read its manifests", "waiting for", name)
				e.waitLogged = true
			}
			return
		}
	}
	e.mu.Unlock()
	if err := e.removeOrphans(ctx); err != nil {
		e.log.Warn("removing leftover pods; will retry", "err", err)
		return
	}
	e.gc(ctx)
	e.settled = true
}

// podDirs lists the UIDs that have a state directory.
func (e *Engine) podDirs() []types.UID {
	ents, err := os.ReadDir(filepath.Join(e.cfg.StateDir, "pods"))
	if err != nil {
		return nil
	}
	var out []types.UID
	for _, d := range ents {
		if d.IsDir() && manifests.CheckUID(d.Name()) == nil {
			out = append(out, types.UID(d.Name()))
		}
	}
	return out
}

func (e *Engine) startWorkerLocked(ctx context.Context, uid types.UID) *podWorker {
	w := newPodWorker(e.env, e, uid)
	e.workers[uid] = w
	var gcDone <-chan struct{}
	if e.gcDone != nil && !e.gcKeep[SandboxID(string(uid))] {
		gcDone = e.gcDone // a running GC may release this sandbox ID
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		if gcDone != nil {
			select {
			case <-gcDone:
			case <-ctx.Done():
				return
			}
		}
		w.run(ctx)
	}()
	return w
}

// workerDone forgets a worker once its pod is gone, unless the pod came back
// meanwhile (the worker then keeps running it).
func (e *Engine) workerDone(w *podWorker) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.workers[w.uid] == w {
		delete(e.workers, w.uid)
	}
	e.putStatusLocked(w.uid, nil)
	// A pod of the same name may be waiting for this one to finish
	// (terminatingSibling). Only those: waking every pod made each removal
	// resync all the others, a containerd listing each.
	ref := podRef(w.lastPod())
	if ref == "" {
		return
	}
	for _, o := range e.workers {
		if podRef(o.lastPod()) == ref {
			o.poke()
		}
	}
}

// terminatingSibling reports whether another pod with the same namespace and
// name is still being torn down; like the kubelet, a static pod's new version
// starts only after the old one is gone (they may share host ports or paths).
func (e *Engine) terminatingSibling(pod *v1.Pod) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for uid, w := range e.workers {
		if uid == pod.UID {
			continue
		}
		if podRef(w.lastPod()) == podRef(pod) && w.isKilling() {
			return true
		}
	}
	return false
}

func (e *Engine) poke(uid types.UID) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if w := e.workers[uid]; w != nil {
		w.poke()
	}
}

func (e *Engine) pokeAll() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, w := range e.workers {
		w.poke()
	}
}

func (e *Engine) setStatus(pod *v1.Pod) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.rolledBackLocked(pod)
	e.putStatusLocked(pod.UID, pod)
}

// Pods returns every pod with its current status, sorted by namespace/name.
func (e *Engine) Pods() []v1.Pod {
	e.mu.Lock()
	out := make([]v1.Pod, 0, len(e.statuses))
	for _, p := range e.statuses {
		out = append(out, *p)
	}
	e.mu.Unlock()
	slices.SortFunc(out, func(a, b v1.Pod) int {
		if a.Namespace != b.Namespace {
			return compare(a.Namespace, b.Namespace)
		}
		return compare(a.Name, b.Name)
	})
	return out
}

// setSource stores a source's latest snapshot. Only the Run goroutine
// writes e.sources, so it reads them without the lock; others lock.
func (e *Engine) setSource(s manifests.Snapshot) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.manifestErrors(e.sources[s.Source].Errors, s.Errors)
	e.sources[s.Source] = s
	e.objectsChanged = e.env.objects.set(e.sources) || e.objectsChanged
}

// pokeForObjects wakes every worker when ConfigMaps or Secrets changed, so
// running pods' configMap, secret and projected volumes follow (see
// refreshConfigVolumes); env waits for a restart. After apply: a pod
// removed with its objects is killed, not told its volume failed.
func (e *Engine) pokeForObjects() {
	e.mu.Lock()
	changed := e.objectsChanged
	e.objectsChanged = false
	e.mu.Unlock()
	if changed {
		e.pokeAll()
	}
}

// Sources returns what each source last reported, sorted by source.
func (e *Engine) Sources() []manifests.SourceInfo {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]manifests.SourceInfo, 0, len(e.sources))
	for _, name := range slices.Sorted(maps.Keys(e.sources)) {
		info := e.sources[name].Info
		for _, err := range e.conflicts[name] {
			info.Errors = append(slices.Clip(info.Errors), err.Error())
		}
		out = append(out, info)
	}
	return out
}

// SourceErrors returns each source's current manifest errors.
func (e *Engine) SourceErrors() map[string][]error {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := map[string][]error{}
	for name, s := range e.sources {
		if errs := append(slices.Clip(s.Errors), e.conflicts[name]...); len(errs) > 0 {
			out[name] = errs
		}
	}
	return out
}

// Healthy reports nil when the sync loop turns and the runtime answers.
func (e *Engine) Healthy(ctx context.Context) error {
	if err := e.LoopHealthy(); err != nil {
		return err
	}
	if err := e.rt.Ping(ctx); err != nil {
		return fmt.Errorf("containerd: %w", err)
	}
	return nil
}

// Ready is closed once, after the first reconcile with every source.
func (e *Engine) Ready() <-chan struct{} { return e.readyCh }

// LoopHealthy reports nil when the first reconcile is done and the sync
// loop still turns, whether or not containerd answers: what restarting
// noderun could fix.
func (e *Engine) LoopHealthy() error {
	last := e.lastLoop.Load()
	if !e.ready.Load() || last == nil {
		return errors.New("first reconcile not finished")
	}
	// The loop wakes at least every resync interval.
	if age := e.clock.Since(*last); age > 3*e.cfg.Resync {
		return fmt.Errorf("sync loop stalled for %s", age.Round(time.Second))
	}
	return nil
}

func compare(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
