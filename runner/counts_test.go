package runner

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

func TestPodCountsString(t *testing.T) {
	for _, tc := range []struct {
		in   PodCounts
		want string
	}{
		{PodCounts{}, "0 pods"},
		{PodCounts{Running: 1}, "1 pod: 1 running"},
		{PodCounts{Running: 2, Pending: 1, Terminating: 1}, "4 pods: 2 running, 1 pending, 1 terminating"},
		{PodCounts{Failed: 1, Succeeded: 2}, "3 pods: 1 failed, 2 succeeded"},
	} {
		if got := tc.in.String(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.in, got, tc.want)
		}
	}
}

// The counts follow the pods' phases, and a change is signalled once
// however many came before the read; an unchanged status is no change.
func TestEngineCountsPods(t *testing.T) {
	f := startEngine(t)
	changed := f.e.CountsChanged()
	f.send(testPod("a", "web", v1.RestartPolicyAlways))
	waitFor(t, "a running pod counted", func() bool { return f.e.PodCounts() == PodCounts{Running: 1} })
	<-changed
	f.e.setStatus(f.status("a")) // the same phase again
	select {
	case <-changed:
		t.Fatal("counts signalled changed with no change")
	case <-time.After(100 * time.Millisecond):
	}
	f.send()
	waitFor(t, "the removed pod uncounted", func() bool { return f.e.PodCounts() == PodCounts{} })
	select {
	case <-changed:
	case <-time.After(waitLimit):
		t.Fatal("no change signalled for the removal")
	}
}

// A status is stamped (its resourceVersion) anew at each change and only
// then: the API's watch store re-marshals the pods whose stamp moved.
func TestStatusStampChangesWithTheStatus(t *testing.T) {
	f := startEngine(t)
	f.send(testPod("a", "web", v1.RestartPolicyAlways))
	waitFor(t, "a running pod", func() bool { return f.e.PodCounts() == PodCounts{Running: 1} })
	first := f.status("a")
	if first.ResourceVersion == "" {
		t.Fatal("status has no stamp")
	}
	same := first.DeepCopy()
	same.ResourceVersion = "" // as a worker publishes it
	f.e.setStatus(same)
	if got := f.status("a").ResourceVersion; got != first.ResourceVersion {
		t.Errorf("unchanged status restamped: %s, was %s", got, first.ResourceVersion)
	}
	changed := first.DeepCopy()
	changed.Status.Message = "something else"
	f.e.setStatus(changed)
	if got := f.status("a").ResourceVersion; got == first.ResourceVersion || got == "" {
		t.Errorf("changed status kept stamp %q", got)
	}
}
