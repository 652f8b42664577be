package runner

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Generations count spec changes as the API server does, and an
// unchanged source object is handed out as the same copy.
func TestStampGenerations(t *testing.T) {
	e := &Engine{generations: map[types.UID]generation{}}
	pod := func(image string, labels map[string]string) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "u", Labels: labels},
			Spec: v1.PodSpec{Containers: []v1.Container{{Name: "a", Image: image}}}}
	}
	stamp := func(p *v1.Pod) *v1.Pod {
		want := map[types.UID]*v1.Pod{}
		if p != nil {
			want["u"] = p
		}
		e.stampGenerationsLocked(want)
		return want["u"]
	}
	first := pod("a:1", nil)
	got := stamp(first)
	if got.Generation != 1 || first.Generation != 0 {
		t.Fatalf("created: generation %d (source's %d), want 1 (0)", got.Generation, first.Generation)
	}
	if again := stamp(first); again != got {
		t.Error("the same source object was given out as a new copy: its worker would sync again")
	}
	steps := []struct {
		name string
		pod  *v1.Pod
		want int64
	}{
		{"labels only", pod("a:1", map[string]string{"x": "y"}), 1},
		{"spec changed", pod("a:2", nil), 2},
		{"spec changed again", pod("a:3", nil), 3},
		{"same spec, new object", pod("a:3", nil), 3},
	}
	for _, s := range steps {
		if got := stamp(s.pod); got.Generation != s.want {
			t.Errorf("%s: generation %d, want %d", s.name, got.Generation, s.want)
		}
	}
	stamp(nil)
	if got := stamp(pod("a:3", nil)); got.Generation != 1 {
		t.Errorf("a pod that went and came back: generation %d, want 1", got.Generation)
	}
}

func TestObserveGeneration(t *testing.T) {
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Generation: 4}, Status: v1.PodStatus{
		Conditions: []v1.PodCondition{{Type: v1.PodReady}, {Type: v1.PodScheduled}}}}
	observeGeneration(p)
	if p.Status.ObservedGeneration != 4 || p.Status.Conditions[0].ObservedGeneration != 4 || p.Status.Conditions[1].ObservedGeneration != 4 {
		t.Errorf("status %+v", p.Status)
	}
}
