package runner

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestChangesWakeWatchers(t *testing.T) {
	e := New(Config{}, nil, nil)
	v0, ch := e.Changes()
	select {
	case <-ch:
		t.Fatal("woken before any change")
	default:
	}
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default", UID: "u1"}}
	e.setStatus(pod)
	select {
	case <-ch:
	case <-time.After(time.Second):
		t.Fatal("a status change did not wake the watcher")
	}
	v1_, ch := e.Changes()
	if v1_ <= v0 {
		t.Fatalf("version %d after a change, was %d", v1_, v0)
	}
	// The same status again (a resync) wakes nobody.
	e.setStatus(pod.DeepCopy())
	if v, _ := e.Changes(); v != v1_ {
		t.Fatalf("an unchanged status bumped the version to %d", v)
	}
	e.events.record(pod, "", "", v1.EventTypeNormal, "Pulled", "x", time.Now())
	select {
	case <-ch:
	case <-time.After(time.Second):
		t.Fatal("an event did not wake the watcher")
	}
}
