package runner

import (
	"errors"
	"io/fs"
	"os"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/noderun/noderun/manifests"
)

// reasonWaitingForDependencies is the reason of a pod held back by its
// noderun.dev/wait-for annotation, in its status and events.
const reasonWaitingForDependencies = "WaitingForDependencies"

// hold is a pod kept from starting until its dependencies hold.
type hold struct {
	message string      // what it waits for
	since   metav1.Time // when it began to wait
}

// unmetDependencies says what of pod's dependencies does not hold yet, ""
// when all do (or it names none). lookup gives the status of the pod with
// a namespace/name, and whether a manifest defines it at all.
func unmetDependencies(pod *v1.Pod, lookup func(key string) (status *v1.Pod, defined bool)) string {
	var unmet []string
	for _, d := range manifests.WaitFor(pod) {
		name := d.String(pod.Namespace)
		st, defined := lookup(d.Key())
		switch {
		case !defined:
			unmet = append(unmet, name+" not found: no manifest defines it")
		case st == nil:
			unmet = append(unmet, name+" not "+string(d.Condition))
		case dependencyHolds(st, d.Condition):
		case st.Status.Phase == v1.PodFailed && st.Status.Reason != "":
			unmet = append(unmet, name+" not "+string(d.Condition)+": "+st.Status.Reason+": "+st.Status.Message)
		case st.Status.Reason == reasonWaitingForDependencies:
			unmet = append(unmet, name+" not "+string(d.Condition)+" (it waits for "+st.Status.Message+")")
		default:
			unmet = append(unmet, name+" not "+string(d.Condition)+" ("+string(st.Status.Phase)+")")
		}
	}
	return strings.Join(unmet, ", ")
}

// dependencyHolds reports whether a pod's status meets a wait condition.
func dependencyHolds(st *v1.Pod, cond manifests.WaitCondition) bool {
	s := &st.Status
	switch cond {
	case manifests.WaitCompleted:
		return s.Phase == v1.PodSucceeded
	case manifests.WaitStarted:
		if s.Phase == v1.PodSucceeded {
			return true
		}
		return s.Phase == v1.PodRunning && len(s.ContainerStatuses) > 0 && !slices.ContainsFunc(s.ContainerStatuses,
			func(cs v1.ContainerStatus) bool { return cs.Started == nil || !*cs.Started })
	}
	return slices.ContainsFunc(s.Conditions, func(c v1.PodCondition) bool {
		return c.Type == v1.PodReady && c.Status == v1.ConditionTrue
	})
}

// holdLocked returns the pods of run that must not start yet, and records
// their Pending status and event. A pod with a worker has started, and one
// whose sandbox dir exists runs since before a noderun restart: neither is
// held back (dependencies are about start only). e.mu is held.
func (e *Engine) holdLocked(want, run map[types.UID]*v1.Pod) map[types.UID]bool {
	byKey := map[string]types.UID{}
	for uid, p := range want {
		byKey[p.Namespace+"/"+p.Name] = uid
	}
	lookup := func(key string) (*v1.Pod, bool) {
		uid, ok := byKey[key]
		return e.statuses[uid], ok
	}
	held := map[types.UID]bool{}
	e.waitedOn = map[string]bool{}
	now := e.clock.Now()
	for uid, pod := range run {
		if e.workers[uid] != nil || len(manifests.WaitFor(pod)) == 0 || e.sandboxExists(uid) {
			continue
		}
		msg := unmetDependencies(pod, lookup)
		if msg == "" {
			if h, ok := e.holds[uid]; ok {
				e.log.Info("pod's dependencies hold", "pod", podRef(pod), "waited", now.Sub(h.since.Time).Round(time.Millisecond))
			}
			continue
		}
		held[uid] = true
		for _, d := range manifests.WaitFor(pod) {
			e.waitedOn[d.Key()] = true
		}
		e.putHoldLocked(pod, msg, now)
	}
	for uid := range e.holds {
		if !held[uid] {
			delete(e.holds, uid)
			// A released pod's worker publishes its status next.
			if _, released := run[uid]; !released && e.workers[uid] == nil && e.rejected[uid].pod == nil {
				e.putStatusLocked(uid, nil)
			}
		}
	}
	return held
}

// putHoldLocked records that pod waits: a Pending status whose reason
// kubectl shows as its STATUS, and an event when what it waits for changes.
func (e *Engine) putHoldLocked(pod *v1.Pod, msg string, now time.Time) {
	h, ok := e.holds[pod.UID]
	if !ok {
		h.since = metav1.NewTime(now)
	}
	if h.message != msg {
		h.message = msg
		e.events.record(pod, "", "", v1.EventTypeNormal, reasonWaitingForDependencies, msg, now)
		e.log.Info("pod waits for its dependencies", "pod", podRef(pod), "unmet", msg)
	}
	e.holds[pod.UID] = h
	out := pod.DeepCopy()
	cond := func(t v1.PodConditionType, ok bool) v1.PodCondition {
		c := v1.PodCondition{Type: t, Status: v1.ConditionFalse, LastTransitionTime: h.since}
		if ok {
			c.Status = v1.ConditionTrue
		} else if t != v1.PodReadyToStartContainers {
			c.Reason, c.Message = reasonWaitingForDependencies, msg
		}
		return c
	}
	out.Status = v1.PodStatus{Phase: v1.PodPending, Reason: reasonWaitingForDependencies, Message: msg,
		QOSClass: QOSClass(pod), HostIP: e.cfg.HostIP, Conditions: []v1.PodCondition{
			cond(v1.PodReadyToStartContainers, false), cond(v1.PodInitialized, len(pod.Spec.InitContainers) == 0),
			cond(v1.PodReady, false), cond(v1.ContainersReady, false), cond(v1.PodScheduled, true),
		}}
	waiting := func(c *v1.Container) v1.ContainerStatus {
		f := false
		return v1.ContainerStatus{Name: c.Name, Image: c.Image, Started: &f,
			State: v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: reasonWaitingForDependencies}}}
	}
	for i := range pod.Spec.InitContainers {
		out.Status.InitContainerStatuses = append(out.Status.InitContainerStatuses, waiting(&pod.Spec.InitContainers[i]))
	}
	for i := range pod.Spec.Containers {
		out.Status.ContainerStatuses = append(out.Status.ContainerStatuses, waiting(&pod.Spec.Containers[i]))
	}
	e.putStatusLocked(pod.UID, out)
}

// sandboxExists reports whether the pod's sandbox dir is there: the pod
// ran since the machine booted (the run dir is emptied by a reboot), so a
// noderun restart adopts it whatever its dependencies do.
func (e *Engine) sandboxExists(uid types.UID) bool {
	_, err := os.Stat(SandboxDir(e.cfg.RunDir, string(uid)))
	return !errors.Is(err, fs.ErrNotExist)
}

// dependencyChangedLocked wakes the loop to look at the held pods again
// when the status of a pod one of them waits for changed. e.mu is held.
func (e *Engine) dependencyChangedLocked(p *v1.Pod) {
	if p == nil || !e.waitedOn[p.Namespace+"/"+p.Name] {
		return
	}
	select {
	case e.depsChanged <- struct{}{}:
	default: // a look is already due; it reads the latest statuses
	}
}
