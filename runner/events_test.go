package runner

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

var evPod = &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "u1"}, Spec: v1.PodSpec{NodeName: "n1"}}

func TestEventsRepeatIntoCount(t *testing.T) {
	var l eventLog
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if !l.record(evPod, "main", fieldContainers, v1.EventTypeWarning, "BackOff", "Back-off restarting", t0) {
		t.Fatal("first event not new")
	}
	l.record(evPod, "", "", v1.EventTypeNormal, "Other", "x", t0.Add(time.Second))
	if l.record(evPod, "main", fieldContainers, v1.EventTypeWarning, "BackOff", "Back-off restarting", t0.Add(time.Minute)) {
		t.Fatal("a repeat reported as new")
	}
	evs := l.list()
	if len(evs) != 2 {
		t.Fatalf("%d events, want 2", len(evs))
	}
	// The repeated one is now the most recent.
	ev := evs[1]
	if ev.Reason != "BackOff" || ev.Count != 2 || !ev.FirstTimestamp.Time.Equal(t0) || !ev.LastTimestamp.Time.Equal(t0.Add(time.Minute)) {
		t.Fatalf("repeat: %+v", ev)
	}
	if ev.InvolvedObject.FieldPath != "spec.containers{main}" || ev.InvolvedObject.UID != "u1" || ev.Source.Host != "n1" {
		t.Errorf("reference %+v, source %+v", ev.InvolvedObject, ev.Source)
	}
}

// Events alike but for their message (a probe's output) are combined once
// there are more than 10 in 10 minutes, as the kubelet's recorder does.
func TestEventsSimilarCombined(t *testing.T) {
	var l eventLog
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 15 {
		l.record(evPod, "main", fieldContainers, v1.EventTypeWarning, "Unhealthy", fmt.Sprintf("Liveness probe failed: %d", i), t0.Add(time.Duration(i)*time.Second))
	}
	evs := l.list()
	if len(evs) != similarEventsMax+1 {
		t.Fatalf("%d events, want %d and one combined", len(evs), similarEventsMax)
	}
	last := evs[len(evs)-1]
	if last.Count != 5 || last.Message != combinedPrefix+"Liveness probe failed: 14" {
		t.Fatalf("combined event: count %d, %q", last.Count, last.Message)
	}
	// A new window starts over.
	l.record(evPod, "main", fieldContainers, v1.EventTypeWarning, "Unhealthy", "Liveness probe failed: new", t0.Add(time.Hour))
	if evs := l.list(); strings.HasPrefix(evs[len(evs)-1].Message, combinedPrefix) {
		t.Errorf("after the window: %q", evs[len(evs)-1].Message)
	}
}

func TestEventsRingBounded(t *testing.T) {
	var l eventLog
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l.record(evPod, "", "", v1.EventTypeNormal, "Keep", "kept", t0)
	for i := range maxEvents + 50 {
		p := evPod.DeepCopy()
		p.UID = types.UID(fmt.Sprint("u", i)) // different objects: nothing combines
		l.record(p, "", "", v1.EventTypeNormal, "Started", "x", t0.Add(time.Duration(i)*time.Second))
		if i == maxEvents-2 {
			// A repeat keeps it among the newest.
			l.record(evPod, "", "", v1.EventTypeNormal, "Keep", "kept", t0.Add(time.Duration(i)*time.Second))
		}
	}
	evs := l.list()
	if len(evs) != maxEvents {
		t.Fatalf("%d events kept, want %d", len(evs), maxEvents)
	}
	found := false
	for _, ev := range evs {
		found = found || ev.Reason == "Keep"
	}
	if !found {
		t.Error("a recently repeated event was dropped as if it were old")
	}
	if len(l.byKey) != maxEvents {
		t.Errorf("%d keys for %d events", len(l.byKey), maxEvents)
	}
}

func TestSandboxFailureReasons(t *testing.T) {
	for _, tt := range []struct {
		err    error
		reason string
	}{
		{fmt.Errorf("network: %w: no CNI config", ErrNetworkNotReady), "NetworkNotReady"},
		{fmt.Errorf("%w: volume data: no such directory", errVolumeSetup), "FailedMount"},
		{errors.New("network: bridge failed"), "FailedCreatePodSandBox"},
	} {
		e := New(Config{}, nil, nil)
		w := newPodWorker(e.env, e, evPod.UID)
		w.sandboxFailed(evPod, tt.err)
		evs := e.Events()
		if len(evs) != 1 || evs[0].Reason != tt.reason || evs[0].Type != v1.EventTypeWarning {
			t.Errorf("%v: %+v, want a %s warning", tt.err, evs, tt.reason)
		}
	}
}

func TestManifestErrorEvents(t *testing.T) {
	e := New(Config{NodeName: "n1"}, nil, nil)
	bad := errors.New("pods/x.yaml:3:1: unknown field")
	e.manifestErrors(nil, []error{bad})
	e.manifestErrors([]error{bad}, []error{bad}) // still there: no new event
	evs := e.Events()
	if len(evs) != 1 || evs[0].Reason != "FailedManifest" || evs[0].InvolvedObject.Kind != "Node" ||
		evs[0].InvolvedObject.Name != "n1" || evs[0].Namespace != "default" || evs[0].Count != 1 {
		t.Fatalf("manifest error events: %+v", evs)
	}
}
