package runner

import (
	"context"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// podWorker owns one pod: all of that pod's operations run on its goroutine,
// one at a time. Its mailbox holds only the latest spec, and a pending kill
// is never overwritten by an older update.
type podWorker struct {
	e    *Engine
	uid  types.UID
	wake chan struct{}

	mu      sync.Mutex
	desired *v1.Pod // latest spec from the sources
	killing bool
	last    *v1.Pod // the spec the worker last acted on

	// Owned by the worker goroutine.
	st podState
}

// podState is what a worker remembers between syncs.
type podState struct {
	started   time.Time
	ips       []string
	sandboxOK bool
	checked   time.Time // last deep network check
	netErr    error
	waiting   map[string]waitReason // container name -> why it is not running
	backoff   map[string]*backoff   // container name -> crash backoff
	persisted bool
	conds     map[v1.PodConditionType]condState
	timer     Timer
}

type waitReason struct{ reason, message string }

func newPodWorker(e *Engine, uid types.UID) *podWorker {
	return &podWorker{
		e: e, uid: uid, wake: make(chan struct{}, 1),
		st: podState{waiting: map[string]waitReason{}, backoff: map[string]*backoff{}},
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

func (w *podWorker) kill() {
	w.mu.Lock()
	w.desired, w.killing = nil, true
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
	w.st.timer = w.e.clock.NewTimer(time.Hour)
	w.st.timer.Stop()
	defer w.st.timer.Stop()
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

		if killing {
			w.markTerminating(last)
			var err error
			onFreshStack(func() { err = w.terminate(ctx, last) })
			w.activity()
			if err != nil {
				w.e.log.Error("pod teardown failed; will retry", "pod", podRef(last), "err", err)
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
		onFreshStack(func() { after = w.sync(ctx, pod) })
		w.activity()
		if after > 0 {
			w.st.timer.Reset(after)
		}
	}
}

// activity tells the engine's observer that this worker acts now.
func (w *podWorker) activity() {
	if on := w.e.cfg.OnActivity; on != nil {
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

// markTerminating keeps the pod listed while it is torn down, with a
// deletionTimestamp as the API server sets it (kubectl shows Terminating).
func (w *podWorker) markTerminating(pod *v1.Pod) {
	if pod == nil || pod.Name == "" {
		return // an orphan known only by its UID: nothing to show
	}
	w.e.mu.Lock()
	defer w.e.mu.Unlock()
	cur := w.e.statuses[w.uid]
	if cur != nil && cur.DeletionTimestamp != nil {
		return
	}
	out := pod.DeepCopy()
	if cur != nil {
		out = cur.DeepCopy()
	}
	now := metav1.NewTime(w.e.clock.Now())
	out.DeletionTimestamp = &now
	out.DeletionGracePeriodSeconds = pod.Spec.TerminationGracePeriodSeconds
	w.e.statuses[w.uid] = out
}

// finished ends the worker unless its pod was wanted again while dying.
func (w *podWorker) finished() bool {
	w.mu.Lock()
	again := w.desired != nil
	w.killing = false
	w.mu.Unlock()
	if again {
		w.st = podState{waiting: map[string]waitReason{}, backoff: map[string]*backoff{}, timer: w.st.timer}
		w.poke()
		return false
	}
	w.e.workerDone(w)
	return true
}

func podRef(p *v1.Pod) string {
	if p == nil {
		return ""
	}
	return p.Namespace + "/" + p.Name
}

// backoff is the kubelet's crash-loop backoff: the first restart is
// immediate, then 10 s doubling up to 5 min; a container that ran cleanly
// for twice the cap starts over.
type backoff struct {
	delay time.Duration // what the next crash will wait
	forID string        // the exited container the current wait is for
	wait  time.Duration
}

const (
	backoffInitial = 10 * time.Second
	backoffMax     = 5 * time.Minute
)

// waitFor returns how long after its exit the container id may be replaced.
// It is stable for one id, so repeated syncs of one crash agree.
func (b *backoff) waitFor(id string, startedAt, finishedAt time.Time) time.Duration {
	if b.forID == id {
		return b.wait
	}
	if finishedAt.Sub(startedAt) > 2*backoffMax {
		b.delay = 0
	}
	b.forID, b.wait = id, b.delay
	if b.delay == 0 {
		b.delay = backoffInitial
	} else {
		b.delay = min(b.delay*2, backoffMax)
	}
	return b.wait
}
