package runner

import (
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"

	v1 "k8s.io/api/core/v1"
)

// generation is what the API server would hold for a pod: the source's pod
// object last seen, and the copy given out in its place, stamped with its
// metadata.generation.
type generation struct {
	src, stamped *v1.Pod
}

// stampGenerationsLocked gives each desired pod the metadata.generation the
// API server gives it: 1 when it appears, one more at each change of its
// spec (a manifest edit that keeps metadata.uid; other edits make a new
// pod). An unchanged source object gets the same copy back, so workers see
// no update. A pod that goes and comes back starts at 1 again, as a new
// object would. e.mu is held.
func (e *Engine) stampGenerationsLocked(want map[types.UID]*v1.Pod) {
	for uid, pod := range want {
		g, ok := e.generations[uid]
		switch {
		case ok && g.src == pod:
		case ok && equality.Semantic.DeepEqual(g.src.Spec, pod.Spec):
			g = generation{pod, withGeneration(pod, g.stamped.Generation)}
		case ok:
			g = generation{pod, withGeneration(pod, g.stamped.Generation+1)}
		default:
			g = generation{pod, withGeneration(pod, 1)}
		}
		e.generations[uid] = g
		want[uid] = g.stamped
	}
	for uid := range e.generations {
		if want[uid] == nil {
			delete(e.generations, uid)
		}
	}
}

// withGeneration is a shallow copy of pod with its generation set: the
// source's object is shared and never written.
func withGeneration(pod *v1.Pod, gen int64) *v1.Pod {
	out := *pod
	out.Generation = gen
	return &out
}

// observeGeneration sets status.observedGeneration and each condition's to
// the generation of the spec the status is of, as the kubelet v1.37 does
// (PodObservedGenerationTracking, GA).
func observeGeneration(pod *v1.Pod) {
	pod.Status.ObservedGeneration = pod.Generation
	for i := range pod.Status.Conditions {
		pod.Status.Conditions[i].ObservedGeneration = pod.Generation
	}
}
