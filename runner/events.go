package runner

import (
	"fmt"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// maxEvents bounds the events kept for the status API, oldest dropped
// first: an appliance runs for years.
const maxEvents = 1000

// eventLog keeps the node's recent events as core/v1 Events, repeated ones
// folded into a count as the API server's event aggregation does.
type eventLog struct {
	mu    sync.Mutex
	seq   int
	items []*v1.Event          // oldest first
	byKey map[string]*v1.Event // pod uid, object, reason, message
	// changed, if set, is called (under mu) after every record.
	changed func()
}

// record adds an event about a pod, or about one of its containers when
// container is set; it reports whether the event is new (not a repeat).
func (l *eventLog) record(pod *v1.Pod, container string, init bool, typ, reason, msg string, now time.Time) bool {
	ref := v1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}
	if container != "" {
		field := "spec.containers"
		if init {
			field = "spec.initContainers"
		}
		ref.FieldPath = field + "{" + container + "}"
	}
	key := string(pod.UID) + "\x00" + ref.FieldPath + "\x00" + reason + "\x00" + msg
	ts := metav1.NewTime(now)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byKey == nil {
		l.byKey = map[string]*v1.Event{}
	}
	if l.changed != nil {
		defer l.changed()
	}
	if ev := l.byKey[key]; ev != nil {
		ev.Count++
		ev.LastTimestamp = ts
		return false
	}
	l.seq++
	ev := &v1.Event{
		TypeMeta:       metav1.TypeMeta{Kind: "Event", APIVersion: "v1"},
		ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", pod.Name, l.seq), Namespace: pod.Namespace},
		InvolvedObject: ref,
		Reason:         reason,
		Message:        msg,
		Type:           typ,
		Count:          1,
		FirstTimestamp: ts,
		LastTimestamp:  ts,
		Source:         v1.EventSource{Component: "noderun", Host: pod.Spec.NodeName},
	}
	l.items = append(l.items, ev)
	l.byKey[key] = ev
	if len(l.items) > maxEvents {
		old := l.items[0]
		l.items = l.items[1:]
		for k, e := range l.byKey {
			if e == old {
				delete(l.byKey, k)
				break
			}
		}
	}
	return true
}

// list returns a copy of the kept events, oldest first.
func (l *eventLog) list() []v1.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]v1.Event, len(l.items))
	for i, ev := range l.items {
		out[i] = *ev
	}
	return out
}

// event records an event for the worker's pod and logs it; a repeat of a
// warning is logged at debug level only, so a flapping probe or an
// offline registry does not flood the log.
func (w *podWorker) event(pod *v1.Pod, container string, init bool, typ, reason, msg string) {
	fresh := w.env.events.record(pod, container, init, typ, reason, msg, w.env.clock.Now())
	log := w.env.log.Debug
	if fresh && (typ == v1.EventTypeWarning || reason == "Killing") {
		log = w.env.log.Info
	}
	log("event", "pod", podRef(pod), "container", container, "reason", reason, "message", msg)
}

// Events returns the kept events, oldest first.
func (e *Engine) Events() []v1.Event { return e.events.list() }
