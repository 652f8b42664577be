package runner

import (
	"context"
	"log/slog"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/noderun/noderun/runner/prober"
)

// podWorker owns one pod: all of that pod's operations run on its goroutine,
// one at a time. Its mailbox holds only the latest spec, and a pending kill
// is never overwritten by an older update.
type podWorker struct {
	env   *podEnv
	board board
	uid   types.UID
	wake  chan struct{}

	mu      sync.Mutex
	desired *v1.Pod // latest spec from the sources
	killing bool
	// stopOrder, once set, stops the pod for the node's shutdown
	// (shutdown.go) and keeps it stopped.
	stopOrder *shutdownOrder
	last      *v1.Pod                 // the spec the worker last acted on
	cancel    context.CancelFunc      // ends the sync in progress (a hook may hang)
	eph       []v1.EphemeralContainer // the pod's ephemeral containers (ephemeral.go)

	ephMu sync.Mutex // one update of the ephemeral containers at a time

	filesMu sync.Mutex // mounting the pod files' tmpfs (ensurePodFiles)

	// Owned by the worker goroutine.
	st podState
}

// podState is what a worker remembers between syncs.
type podState struct {
	started   time.Time
	ips       []string
	sandboxOK bool
	// oldReleased: the network of a sandbox gone with a reboot was
	// released for a pod that gets no new one (syncWithoutSandbox).
	oldReleased bool
	// endedCounted: the pod ended and the QoS parents were updated.
	endedCounted bool
	checked      time.Time // last deep network check
	netErr       error
	waiting      map[string]waitReason // container name -> why it is not running
	backoff      map[string]*backoff   // container name -> crash backoff
	persisted    bool
	conds        map[v1.PodConditionType]condState
	timer        clock.Timer
	epoch        string                      // the current sandbox's, see sandboxEpoch
	startErr     map[string]*ContainerStatus // runs the runtime could not start
	messages     map[string]string           // termination messages by name/restart
	pullUntil    map[string]time.Time        // no pull before this, by container name
	pulledAhead  map[string]ImageConfig      // images pulled before the old version went, by container name
	// readyKept: the pod was Ready and is kept as its last Ready version;
	// rollbackAsked: its rollback deadline passed and was acted on.
	readyKept, rollbackAsked bool
	// Containers created while the sandbox's network was being set up,
	// by name, for this sync to start (overlap.go).
	precreated map[string]*precreated
	// reset: containers RestartAllContainers removed, by name, with the
	// restart count their next run gets (restartall.go).
	reset map[string]int
	// listedEmpty: this sync found the pod without containers before it
	// precreated some, so its listing needs no runtime call.
	listedEmpty bool
	// configRev is the config objects' revision the pod's configMap,
	// secret and projected volumes were last written from.
	configRev uint64
}

func newPodState(timer clock.Timer) podState {
	return podState{waiting: map[string]waitReason{}, backoff: map[string]*backoff{},
		startErr: map[string]*ContainerStatus{}, timer: timer}
}

type waitReason struct{ reason, message string }

// podEnv is what every pod worker needs from the node; the engine builds
// it once and shares it.
type podEnv struct {
	cfg    *Config // read-only after New
	rt     Runtime
	net    Network
	probes *prober.Manager
	execer prober.Execer
	events *eventLog
	clock  clock.WithTicker
	log    *slog.Logger
	// noSwap: containers get the kubelet's NoSwap limits, the host
	// having the swap controller (looked for once, as the kubelet does).
	noSwap bool
	// objects are the sources' ConfigMaps and Secrets.
	objects *configObjects
	// limitedSwap: the node runs the kubelet's LimitedSwap and the host
	// can apply it (cgroup v2 with the swap controller).
	limitedSwap bool
}

// board is the engine's shared state as a worker may touch it; the engine
// owns the maps and the lock behind it.
type board interface {
	setStatus(*v1.Pod)
	// markTerminating lists the pod as Terminating (a deletionTimestamp)
	// while it is torn down.
	markTerminating(uid types.UID, pod *v1.Pod, now time.Time)
	terminatingSibling(*v1.Pod) bool
	// replacement is the old version pod uid waits to replace until it
	// has pulled its images (update.go), or nil; imagesPulled ends that.
	replacement(uid types.UID) *v1.Pod
	imagesPulled(uid types.UID)
	// versionReady keeps a Ready pod as its name's last Ready version;
	// rollBack replaces one not Ready in time by that (rollback.go).
	versionReady(*v1.Pod) error
	rollBack(pod *v1.Pod, after time.Duration, reason, message string) (bool, error)
	// updateQoS sets the QoS parents' shares from the pods wanted now.
	updateQoS(context.Context) error
	workerDone(*podWorker)
}

func newPodWorker(env *podEnv, b board, uid types.UID) *podWorker {
	return &podWorker{
		env: env, board: b, uid: uid, wake: make(chan struct{}, 1),
		st: newPodState(nil),
	}
}

// update hands the worker its pod's latest spec. Sources reuse the pod
// object of an unchanged manifest, so an unchanged pod costs no sync.
func (w *podWorker) update(pod *v1.Pod) {
	w.mu.Lock()
	same := w.desired == pod && !w.killing
	w.desired, w.killing = pod, false
	w.mu.Unlock()
	if !same {
		w.poke()
	}
}

// kill asks the worker to tear its pod down, ending a sync in progress
// (a postStart hook that hangs must not keep the pod forever).
func (w *podWorker) kill() {
	w.mu.Lock()
	if w.last == nil {
		// Killed before its first sync: the pod it was given is the one
		// to tear down (its containers may be adopted ones).
		w.last = w.desired
	}
	w.desired, w.killing = nil, true
	if w.cancel != nil {
		w.cancel()
	}
	w.mu.Unlock()
	w.poke()
}

func (w *podWorker) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *podWorker) lastPod() *v1.Pod {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.desired != nil {
		return w.desired
	}
	return w.last
}

func (w *podWorker) isKilling() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.killing
}

// run is the worker's loop: wait for a poke or a backoff timer, then act on
// the latest state. It ends once its pod is killed and not wanted again.
func (w *podWorker) run(ctx context.Context) {
	w.st.timer = w.env.clock.NewTimer(time.Hour)
	w.st.timer.Stop()
	defer w.st.timer.Stop()
	w.loadEphemeral()
	announced := false // the pod's Pending status, before its first sync
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.wake:
		case <-w.st.timer.C():
		}
		w.activity()
		w.mu.Lock()
		pod, killing := w.desired, w.killing
		if pod != nil {
			w.last = pod
		}
		last := w.last
		w.mu.Unlock()

		if killing && last == nil { // never given a pod: nothing to tear down
			if w.finished() {
				return
			}
			continue
		}
		if killing {
			if last.Name != "" { // an orphan known only by its UID shows nothing
				w.board.markTerminating(w.uid, last, w.env.clock.Now())
			}
			var err error
			onFreshStack(func() { err = w.terminate(ctx, last) })
			w.activity()
			if err != nil {
				w.env.log.Error("pod teardown failed; will retry", "pod", podRef(last), "err", err)
				w.st.timer.Reset(5 * time.Second)
				continue
			}
			if w.finished() {
				return
			}
			continue
		}
		if pod == nil {
			continue
		}
		var after time.Duration
		sctx, cancel := context.WithCancel(ctx)
		w.mu.Lock()
		if w.killing {
			cancel()
		}
		w.cancel = cancel
		w.mu.Unlock()
		if !announced && w.board.replacement(pod.UID) == nil {
			// The old version is listed while the new one pulls.
			announced = true
			w.publishPending(pod)
		}
		onFreshStack(func() { after = w.sync(sctx, pod) })
		w.mu.Lock()
		w.cancel = nil
		w.mu.Unlock()
		cancel()
		w.activity()
		if after > 0 {
			w.st.timer.Reset(after)
		}
	}
}

// activity tells the engine's observer that this worker acts now.
func (w *podWorker) activity() {
	if on := w.env.cfg.OnActivity; on != nil {
		on()
	}
}

// onFreshStack runs fn on a new goroutine and waits for it. A sync goes
// deep (gRPC, JSON, spec building) and grows its stack to tens of KiB; on a
// short-lived goroutine that stack is freed afterwards instead of staying
// with every idle pod worker.
func onFreshStack(fn func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	<-done
}

// finished ends the worker unless its pod was wanted again while dying.
func (w *podWorker) finished() bool {
	w.mu.Lock()
	again := w.desired != nil
	w.killing = false
	w.eph = nil // they went with the pod's teardown
	w.mu.Unlock()
	if again {
		w.st = newPodState(w.st.timer)
		w.poke()
		return false
	}
	w.board.workerDone(w)
	return true
}

func podRef(p *v1.Pod) string {
	if p == nil {
		return ""
	}
	return p.Namespace + "/" + p.Name
}

// backoff is the kubelet's crash-loop backoff: the first restart is
// immediate, then 10 s doubling up to 5 min (or up to the node's
// --crashloop-max-backoff); a container that ran cleanly for 10 min starts
// over.
type backoff struct {
	delay time.Duration // what the next crash will wait
	// initial and cap bound the delay (zero: 10 s and 5 min).
	initial, cap time.Duration
	forID        string // the exited container the current wait is for
	wait         time.Duration
	// until is when the current wait ends and seen when the crash it is
	// for was seen, both on the monotonic clock, so a step of the wall
	// clock changes nothing.
	until, seen time.Time
}

const (
	backoffInitial = 10 * time.Second
	backoffMax     = 5 * time.Minute
	// backoffExpiry is the kubelet's crashLoopBackOff.HasExpiredFunc: a
	// crash seen this long after the last one starts the delay over,
	// whatever the cap.
	backoffExpiry = 600 * time.Second
	// Bounds of --crashloop-max-backoff, the kubelet's
	// crashLoopBackOff.maxContainerRestartPeriod (KEP-5593).
	MinCrashLoopMaxBackoff = time.Second
	MaxCrashLoopMaxBackoff = 300 * time.Second
)

// crashBackoff is a container's crash-loop backoff capped at max (0: the
// kubelet's 5 min), its first delay 10 s or max if lower, as the kubelet's
// newCrashLoopBackOff.
func crashBackoff(max time.Duration) *backoff {
	if max <= 0 {
		max = backoffMax
	}
	return &backoff{initial: min(backoffInitial, max), cap: max}
}

// waitFor returns how long after its exit the container id may be replaced.
// It is stable for one id, so repeated syncs of one crash agree. As in the
// kubelet's backoff, the delay starts over when the previous crash was seen
// more than backoffExpiry ago. The runtime's wall-clock finish time
// counts only as an age between 0 and the wait, taken when the exit is
// first seen (now): a finish time in the future (the clock stepped back)
// or far past cannot stretch or skip the wait.
func (b *backoff) waitFor(id string, finishedAt, now time.Time) time.Duration {
	if b.forID == id {
		return b.wait
	}
	if !b.seen.IsZero() && now.Sub(b.seen) > backoffExpiry {
		b.delay = 0
	}
	b.forID, b.wait, b.seen = id, b.delay, now
	age := min(max(now.Sub(finishedAt), 0), b.wait)
	b.until = now.Add(b.wait - age)
	initial, limit := b.initial, b.cap
	if limit == 0 {
		initial, limit = backoffInitial, backoffMax
	}
	if b.delay == 0 {
		b.delay = initial
	} else {
		b.delay = min(b.delay*2, limit)
	}
	return b.wait
}
