package runner

import (
	"cmp"
	"fmt"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
)

// PodCounts is how many pods are in each phase, and how many are being
// torn down, for systemd's one-line status.
type PodCounts struct {
	Pending, Running, Succeeded, Failed, Terminating int
}

// String reads like "3 pods: 2 running, 1 pending".
func (c PodCounts) String() string {
	total := c.Pending + c.Running + c.Succeeded + c.Failed + c.Terminating
	var parts []string
	for _, p := range []struct {
		n    int
		name string
	}{{c.Running, "running"}, {c.Pending, "pending"}, {c.Failed, "failed"}, {c.Succeeded, "succeeded"}, {c.Terminating, "terminating"}} {
		if p.n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", p.n, p.name))
		}
	}
	s := fmt.Sprintf("%d pods", total)
	if total == 1 {
		s = "1 pod"
	}
	if len(parts) > 0 {
		s += ": " + strings.Join(parts, ", ")
	}
	return s
}

// field is the count pod falls in; nil for none.
func (c *PodCounts) field(pod *v1.Pod) *int {
	switch {
	case pod == nil:
		return nil
	case pod.DeletionTimestamp != nil:
		return &c.Terminating
	case pod.Status.Phase == v1.PodRunning:
		return &c.Running
	case pod.Status.Phase == v1.PodSucceeded:
		return &c.Succeeded
	case pod.Status.Phase == v1.PodFailed:
		return &c.Failed
	}
	return &c.Pending
}

// putStatusLocked replaces uid's status (nil removes it) and keeps the
// counts, telling CountsChanged when they change. A status's
// resourceVersion is a stamp that changes with it and only then. e.mu is
// held.
func (e *Engine) putStatusLocked(uid types.UID, pod *v1.Pod) {
	before := e.counts
	// Every resync republishes each pod's status, mostly unchanged:
	// watchers are woken only by a real change.
	old, had := e.statuses[uid]
	if pod != nil {
		observeGeneration(pod)
	}
	if pod != nil && had {
		pod.ResourceVersion = old.ResourceVersion // the stamp is no part of the status
	}
	changed := pod == nil && had || pod != nil && !equality.Semantic.DeepEqual(old, pod)
	if changed && pod != nil {
		// Stamped at each change, so that the API's watch store marshals
		// only the pods that changed instead of every pod at every change.
		e.statusRev++
		pod.ResourceVersion = strconv.FormatUint(e.statusRev, 10)
	}
	if f := e.counts.field(e.statuses[uid]); f != nil {
		*f--
	}
	if pod == nil {
		delete(e.statuses, uid)
	} else {
		e.statuses[uid] = pod
	}
	if f := e.counts.field(pod); f != nil {
		*f++
	}
	if changed {
		e.changes.bump()
		e.dependencyChangedLocked(cmp.Or(pod, old))
	}
	if e.counts != before {
		select {
		case e.countsChanged <- struct{}{}:
		default: // a change is already pending; the reader takes the latest counts
		}
	}
}

// PodCounts returns how many pods are in each phase now.
func (e *Engine) PodCounts() PodCounts {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.counts
}

// CountsChanged receives after the pod counts changed; several changes
// between two reads come as one.
func (e *Engine) CountsChanged() <-chan struct{} { return e.countsChanged }
