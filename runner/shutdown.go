package runner

import (
	"context"
	"errors"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// The kubelet's node shutdown manager's words (pkg/kubelet/nodeshutdown):
// a stopped pod's status, the rejection of a pod that comes meanwhile,
// and the node's event and Ready message.
const (
	reasonShutdown           = "Terminated"
	shutdownMessage          = "Pod was terminated in response to imminent node shutdown."
	reasonShutdownRejected   = "NodeShutdown"
	shutdownRejectedMessage  = "Pod was rejected as the node is shutting down."
	shutdownEventReason      = "NodeShutdown"
	shutdownDetectedMessage  = "Shutdown manager detected shutdown event"
	shutdownCancelledMessage = "Shutdown manager detected shutdown cancellation"
)

// errShuttingDown is the node's Ready message while it shuts down.
var errShuttingDown = errors.New("node is shutting down")

// The priorities the kubelet groups pods by: the API server's default, and
// the system classes' (scheduling.SystemCriticalPriority and the two
// classes built on it).
const (
	systemCriticalPriority = 2000000000
	nodeCriticalPriority   = 2000001000
)

// shutdownPeriods are the kubelet's shutdownGracePeriod and
// shutdownGracePeriodCriticalPods: regular pods get total less critical,
// then critical pods get critical.
type shutdownPeriods struct{ total, critical time.Duration }

// shutdownGroup is the pods stopped together, given at most period.
type shutdownGroup struct {
	period time.Duration
	pods   []*podWorker
}

// groups splits the pods as the kubelet's migrated configuration does:
// priority below SystemCriticalPriority is regular, the rest critical.
// Periods are whole seconds, as the kubelet counts them.
func (p shutdownPeriods) groups(ws []*podWorker) []shutdownGroup {
	regular := shutdownGroup{period: (p.total - p.critical).Truncate(time.Second)}
	critical := shutdownGroup{period: p.critical.Truncate(time.Second)}
	for _, w := range ws {
		if shutdownPriority(w.lastPod()) >= systemCriticalPriority {
			critical.pods = append(critical.pods, w)
		} else {
			regular.pods = append(regular.pods, w)
		}
	}
	return []shutdownGroup{regular, critical}
}

// shutdownPriority is the pod's priority: spec.priority, else the one the
// API server's priority admission gives the system classes (a static pod
// never meets it; kubeadm's manifests set both fields for that reason).
func shutdownPriority(pod *v1.Pod) int32 {
	if pod.Spec.Priority != nil {
		return *pod.Spec.Priority
	}
	switch pod.Spec.PriorityClassName {
	case SystemNodeCritical:
		return nodeCriticalPriority
	case "system-cluster-critical":
		return systemCriticalPriority
	}
	return 0
}

// Shutdown stops the node's pods before the host shuts down, as the
// kubelet's node shutdown manager does on logind's PrepareForShutdown:
// from now on new pods are rejected (NodeShutdown) and the node is not
// Ready; regular pods are stopped together (preStop hooks, then their
// grace period, both within grace less critical), then critical ones
// within critical. Each group is waited for until its pods have stopped
// or its period has passed. A stopped pod stays Failed
// (reason Terminated) until its manifest changes or noderun restarts.
func (e *Engine) Shutdown(ctx context.Context, grace, critical time.Duration) {
	now := e.clock.Now()
	e.mu.Lock()
	e.shuttingDown = true
	var ws []*podWorker
	for uid, w := range e.workers {
		if w.lastPod() != nil && !w.isKilling() && !e.finishedLocked(uid) {
			ws = append(ws, w)
		}
	}
	e.changes.bump() // the node's Ready condition
	e.mu.Unlock()
	e.nodeEvent(shutdownDetectedMessage, now)
	for _, g := range (shutdownPeriods{grace, critical}).groups(ws) {
		if len(g.pods) == 0 {
			continue // the kubelet does not wait for an empty group
		}
		done := make([]<-chan struct{}, 0, len(g.pods))
		for _, w := range g.pods {
			// The pod's own grace period when it is shorter.
			stop := g.period
			if tg := w.lastPod().Spec.TerminationGracePeriodSeconds; tg != nil && time.Duration(*tg)*time.Second <= stop {
				stop = time.Duration(*tg) * time.Second
			}
			done = append(done, w.shutdown(stop))
		}
		timer := e.clock.NewTimer(g.period)
		waitAll(ctx, done, timer.C())
		timer.Stop()
	}
}

// CancelShutdown is logind's PrepareForShutdown(false): new pods are
// admitted again and the node is Ready. Pods already stopped stay so, as
// under the kubelet.
func (e *Engine) CancelShutdown() {
	e.mu.Lock()
	was := e.shuttingDown
	e.shuttingDown = false
	e.changes.bump()
	e.mu.Unlock()
	if was {
		e.nodeEvent(shutdownCancelledMessage, e.clock.Now())
	}
}

// ShutdownStatus reports the node shutting down as an error, for its
// Ready condition, as the kubelet's ShutdownStatus.
func (e *Engine) ShutdownStatus() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.shuttingDown {
		return errShuttingDown
	}
	return nil
}

func (e *Engine) nodeEvent(msg string, now time.Time) {
	node := v1.ObjectReference{Kind: "Node", Name: e.cfg.NodeName, UID: types.UID(e.cfg.NodeName)}
	e.events.recordRef(node, e.cfg.NodeName, v1.EventTypeNormal, shutdownEventReason, msg, now)
}

// waitAll waits for every channel to close, or for timeout or ctx.
func waitAll(ctx context.Context, done []<-chan struct{}, timeout <-chan time.Time) {
	for _, d := range done {
		select {
		case <-d:
		case <-timeout:
			return
		case <-ctx.Done():
			return
		}
	}
}

// shutdownOrder is a pod's stop for the node's shutdown: its grace
// period; done closes once none of its containers runs.
type shutdownOrder struct {
	grace time.Duration
	done  chan struct{}
	once  sync.Once
}

func (o *shutdownOrder) finish() { o.once.Do(func() { close(o.done) }) }

// shutdown orders the worker to stop its pod for the node's shutdown,
// ending a sync in progress; the first order stands.
func (w *podWorker) shutdown(grace time.Duration) <-chan struct{} {
	w.mu.Lock()
	if w.stopOrder == nil {
		w.stopOrder = &shutdownOrder{grace: grace, done: make(chan struct{})}
		if w.cancel != nil {
			w.cancel()
		}
	}
	o := w.stopOrder
	w.mu.Unlock()
	w.poke()
	return o.done
}

func (w *podWorker) shutdownOrdered() *shutdownOrder {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stopOrder
}

// syncShutdown stops what runs of the pod with the order's grace period
// and starts nothing: the kubelet's killPodFunc with a grace override. The
// pod shows Failed (reason Terminated) from the start, as the kubelet sets
// it before the kill.
func (w *podWorker) syncShutdown(ctx context.Context, pod *v1.Pod, o *shutdownOrder) time.Duration {
	latest, ok := w.observe(ctx, pod)
	if !ok {
		return w.failDelay("list")
	}
	w.discardPrecreated(ctx)
	stop := pod.DeepCopy()
	secs := int64(o.grace / time.Second)
	stop.Spec.TerminationGracePeriodSeconds = &secs
	v := w.view(stop, latest)
	var acts, scratch podActions
	acts.initDone = scratch.initActions(v) // for the Initialized condition only
	acts.failed = reasonShutdown
	acts.killAll(v, "")
	for i := range acts.kill {
		if acts.kill[i].message == "" {
			acts.kill[i].message = "Stopping container " + acts.kill[i].c.Name
		}
	}
	w.publish(pod, latest, acts)
	retry := w.act(ctx, stop, acts, latest)
	w.publish(pod, latest, acts)
	if anyLive(latest) {
		return minPositive(retry, w.failDelay("unknown"))
	}
	w.podEnded(ctx, pod)
	o.finish()
	return retry
}
