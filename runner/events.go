package runner

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// maxEvents bounds the events kept for the status API, oldest dropped
// first: an appliance runs for years.
const maxEvents = 1000

// The kubelet's event aggregation (client-go's EventCorrelator): once
// similarEventsMax events alike but for their message come within
// similarEventsWindow, later ones are folded into one event whose message
// says so, instead of one event per message (a failing probe's output
// differs every time).
const (
	similarEventsMax    = 10
	similarEventsWindow = 10 * time.Minute
	combinedPrefix      = "(combined from similar events): "
)

// eventLog keeps the node's recent events as core/v1 Events, repeated ones
// folded into a count as the kubelet's event recorder does.
type eventLog struct {
	mu      sync.Mutex
	seq     int
	rev     uint64               // the last stamp given an event
	items   []*v1.Event          // least recently recorded first
	byKey   map[string]*v1.Event // object, fieldPath, type, reason, message
	similar map[string]*similarEvents
	// changed, if set, is called (under mu) after every record.
	changed func()
}

// similarEvents counts the distinct messages of events alike but for their
// message, in the current window.
type similarEvents struct {
	since    time.Time
	messages map[string]bool
}

// The lists a container is declared in, as the kubelet names them in an
// event's involvedObject.fieldPath (spec.containers{name} and so on).
const (
	fieldContainers          = "spec.containers"
	fieldInitContainers      = "spec.initContainers"
	fieldEphemeralContainers = "spec.ephemeralContainers"
)

// fieldOf is the list of a regular or init container.
func fieldOf(init bool) string {
	if init {
		return fieldInitContainers
	}
	return fieldContainers
}

// record adds an event about a pod, or about one of its containers when
// container is set (declared in the list field); it reports whether the
// event is new (not a repeat).
func (l *eventLog) record(pod *v1.Pod, container, field, typ, reason, msg string, now time.Time) bool {
	ref := v1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}
	if container != "" {
		ref.FieldPath = field + "{" + container + "}"
	}
	return l.recordRef(ref, pod.Spec.NodeName, typ, reason, msg, now)
}

// recordRef adds an event about any object; host is the node's name.
func (l *eventLog) recordRef(ref v1.ObjectReference, host, typ, reason, msg string, now time.Time) bool {
	alike := string(ref.UID) + "\x00" + ref.Kind + "\x00" + ref.Name + "\x00" + ref.FieldPath + "\x00" + typ + "\x00" + reason
	ts := metav1.NewTime(now)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.changed != nil {
		defer l.changed()
	}
	if l.byKey == nil {
		l.byKey, l.similar = map[string]*v1.Event{}, map[string]*similarEvents{}
	}
	if l.tooSimilar(alike, msg, now) {
		msg = combinedPrefix + msg
	}
	// A combined event is one event whatever its latest message.
	key := alike + "\x00" + msg
	if after, ok := cutCombined(msg); ok {
		key, msg = alike+"\x00"+combinedPrefix, combinedPrefix+after
	}
	if ev := l.byKey[key]; ev != nil {
		ev.Count++
		ev.LastTimestamp = ts
		ev.Message = msg
		l.stamp(ev)
		l.moveToEnd(ev)
		return false
	}
	l.seq++
	name := ref.Name
	if name == "" {
		name = "noderun"
	}
	ns := ref.Namespace
	if ns == "" {
		ns = metav1.NamespaceDefault // where the kubelet records node events
	}
	ev := &v1.Event{
		TypeMeta:       metav1.TypeMeta{Kind: "Event", APIVersion: "v1"},
		ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", name, l.seq), Namespace: ns},
		InvolvedObject: ref,
		Reason:         reason,
		Message:        msg,
		Type:           typ,
		Count:          1,
		FirstTimestamp: ts,
		LastTimestamp:  ts,
		Source:         v1.EventSource{Component: "noderun", Host: host},
	}
	l.stamp(ev)
	l.items = append(l.items, ev)
	l.byKey[key] = ev
	if len(l.items) > maxEvents {
		l.forget(l.items[0], now)
	}
	return true
}

// stamp gives ev a resourceVersion of its own at each change, so that the
// API's watch store marshals only the events that changed.
func (l *eventLog) stamp(ev *v1.Event) {
	l.rev++
	ev.ResourceVersion = strconv.FormatUint(l.rev, 10)
}

func cutCombined(msg string) (string, bool) {
	if len(msg) >= len(combinedPrefix) && msg[:len(combinedPrefix)] == combinedPrefix {
		return msg[len(combinedPrefix):], true
	}
	return "", false
}

// tooSimilar notes msg among the events alike and reports whether they
// are now too many to keep apart.
func (l *eventLog) tooSimilar(alike, msg string, now time.Time) bool {
	s := l.similar[alike]
	if s == nil || now.Sub(s.since) > similarEventsWindow {
		s = &similarEvents{since: now, messages: map[string]bool{}}
		l.similar[alike] = s
	}
	s.messages[msg] = true
	return len(s.messages) > similarEventsMax
}

// moveToEnd keeps the ring ordered by last record, so a repeating event
// is the last to be dropped.
func (l *eventLog) moveToEnd(ev *v1.Event) {
	for i, e := range l.items {
		if e == ev {
			copy(l.items[i:], l.items[i+1:])
			l.items[len(l.items)-1] = ev
			return
		}
	}
}

// forget drops the oldest event and what refers to it, and the similar
// counts whose window has passed.
func (l *eventLog) forget(old *v1.Event, now time.Time) {
	l.items = l.items[1:]
	for k, e := range l.byKey {
		if e == old {
			delete(l.byKey, k)
			break
		}
	}
	for k, s := range l.similar {
		if now.Sub(s.since) > similarEventsWindow {
			delete(l.similar, k)
		}
	}
}

// list returns a copy of the kept events, least recently recorded first.
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
	field := fieldOf(init)
	if w.isEphemeral(container) {
		field = fieldEphemeralContainers
	}
	fresh := w.env.events.record(pod, container, field, typ, reason, msg, w.env.clock.Now())
	log := w.env.log.Debug
	if fresh && (typ == v1.EventTypeWarning || reason == "Killing") {
		log = w.env.log.Info
	}
	log("event", "pod", podRef(pod), "container", container, "reason", reason, "message", msg)
}

// errVolumeSetup marks a pod volume that could not be set up.
var errVolumeSetup = errors.New("volume setup")

// sandboxFailed records why a pod's sandbox could not be made, with the
// kubelet's reason: NetworkNotReady while there is no CNI config,
// FailedMount for a volume, FailedCreatePodSandBox otherwise.
func (w *podWorker) sandboxFailed(pod *v1.Pod, err error) {
	switch {
	case errors.Is(err, ErrNetworkNotReady):
		w.event(pod, "", false, v1.EventTypeWarning, "NetworkNotReady", "network is not ready: "+err.Error())
	case errors.Is(err, errVolumeSetup):
		msg := err.Error()
		if fm := (*failedMount)(nil); errors.As(err, &fm) {
			msg = fm.Error() // the kubelet's words
		}
		w.event(pod, "", false, v1.EventTypeWarning, "FailedMount", msg)
	default:
		w.event(pod, "", false, v1.EventTypeWarning, "FailedCreatePodSandBox", "Failed to create pod sandbox: "+err.Error())
	}
}

// manifestErrors records an event on the node for each manifest error a
// source reports that it did not report last time (noderun's own reason:
// there is no pod to attach it to).
func (e *Engine) manifestErrors(prev, cur []error) {
	seen := map[string]bool{}
	for _, err := range prev {
		seen[err.Error()] = true
	}
	for _, err := range cur {
		if !seen[err.Error()] {
			e.NodeEvent(v1.EventTypeWarning, "FailedManifest", err.Error())
		}
	}
}

// NodeEvent records an event about the node itself, for the parts of
// noderun beside the engine (mirror mode's failed calls).
func (e *Engine) NodeEvent(typ, reason, msg string) {
	node := v1.ObjectReference{Kind: "Node", Name: e.cfg.NodeName, UID: types.UID(e.cfg.NodeName)}
	e.events.recordRef(node, e.cfg.NodeName, typ, reason, msg, e.clock.Now())
}

// Events returns the kept events, least recently recorded first.
func (e *Engine) Events() []v1.Event { return e.events.list() }
