package kubeapi

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// An object whose backend stamp (resourceVersion) is the one last synced is
// taken as unchanged without marshalling it; a new stamp, or no stamp, is
// compared by content.
func TestStoreTrustsStamps(t *testing.T) {
	var pods []v1.Pod
	s := newStore(func() []v1.Pod { return append([]v1.Pod(nil), pods...) },
		func(p *v1.Pod) *metav1.ObjectMeta { return &p.ObjectMeta },
		func(p *v1.Pod) string { return p.Namespace + "/" + p.Name })
	stamped := func(name, stamp string, phase v1.PodPhase) v1.Pod {
		p := phasePod(name, phase)
		p.ResourceVersion = stamp
		return p
	}
	version := uint64(0)
	step := func(want ...watch.EventType) {
		t.Helper()
		version++
		before := len(s.history)
		s.sync(version)
		var got []watch.EventType
		for _, c := range s.history[before:] {
			got = append(got, c.typ)
		}
		if len(got) != len(want) {
			t.Fatalf("sync %d: changes %v, want %v", version, got, want)
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("sync %d: changes %v, want %v", version, got, want)
			}
		}
	}
	pods = []v1.Pod{stamped("a", "1", v1.PodPending), stamped("b", "", v1.PodPending)}
	s.sync(version) // the initial list
	// Same stamp, other content: trusted, not looked at.
	pods = []v1.Pod{stamped("a", "1", v1.PodRunning), stamped("b", "", v1.PodPending)}
	step()
	// New stamp, same content as served: no change.
	pods = []v1.Pod{stamped("a", "2", v1.PodPending), stamped("b", "", v1.PodPending)}
	step()
	// New stamp, new content; no stamp, new content.
	pods = []v1.Pod{stamped("a", "3", v1.PodRunning), stamped("b", "", v1.PodRunning)}
	step(watch.Modified, watch.Modified)
	if got := s.items[0].Status.Phase; got != v1.PodRunning {
		t.Errorf("served phase %s", got)
	}
	if rv := s.items[0].ResourceVersion; rv != "4" {
		t.Errorf("served resourceVersion %q, want the store's own, 4", rv)
	}
	// Unchanged stamp keeps the served resourceVersion.
	step()
	if rv := s.items[0].ResourceVersion; rv != "4" {
		t.Errorf("served resourceVersion %q after an unchanged sync, want 4", rv)
	}
}

// A watcher too slow for its buffer is ended and holds none of the
// changes queued for it.
func TestStoreEndsSlowWatcherEmpty(t *testing.T) {
	var pods []v1.Pod
	s := newStore(func() []v1.Pod { return append([]v1.Pod(nil), pods...) },
		func(p *v1.Pod) *metav1.ObjectMeta { return &p.ObjectMeta },
		func(p *v1.Pod) string { return p.Namespace + "/" + p.Name })
	s.sync(0)
	_, w, _, _ := s.watch(0)
	for i := range watcherBuffer + 1 {
		phase := v1.PodPending
		if i%2 == 1 {
			phase = v1.PodRunning
		}
		pods = []v1.Pod{phasePod("a", phase)}
		s.sync(uint64(i + 1))
	}
	if s.watcherCount() != 0 {
		t.Fatal("the slow watcher was not ended")
	}
	if n := len(w.ch); n != 0 {
		t.Errorf("the ended watcher still holds %d changes", n)
	}
	if _, ok := <-w.ch; ok {
		t.Error("the ended watcher's channel is open")
	}
}
