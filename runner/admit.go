package runner

import (
	"cmp"
	"reflect"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/noderun/noderun/internal/admission"
)

// reasonUserNamespacesUnsupported is the rejection of a pod with
// hostUsers: false on a runtime without user namespaces.
const reasonUserNamespacesUnsupported = "UserNamespacesUnsupported"

// rejection is a pod version admission turned away: it keeps its Failed
// status, and never gets a worker, until its manifest changes.
type rejection struct {
	pod *v1.Pod // the version rejected
}

// sameVersion reports whether p is the manifest version that was
// rejected (a manifest with metadata.uid keeps its UID across edits).
func (r rejection) sameVersion(p *v1.Pod) bool {
	return reflect.DeepEqual(r.pod.Spec, p.Spec) && reflect.DeepEqual(r.pod.Labels, p.Labels)
}

// admitLocked returns the desired pods that may run, as the kubelet's
// HandlePodAdditions decides: a pod with a worker was admitted before
// (admission is once per pod); each new one, in the kubelet's order, is
// checked against the node beside the pods admitted so far. A rejected
// pod gets the kubelet's Failed status and event instead of a worker, so
// nothing of it ever runs. ran holds the pods with state from before a
// noderun restart. e.mu is held.
func (e *Engine) admitLocked(want map[types.UID]*v1.Pod, ran map[types.UID]bool) map[types.UID]*v1.Pod {
	for uid := range e.rejected {
		if p, ok := want[uid]; !ok || !e.rejected[uid].sameVersion(p) {
			delete(e.rejected, uid)
			if e.workers[uid] == nil {
				e.putStatusLocked(uid, nil)
			}
		}
	}
	out := map[types.UID]*v1.Pod{}
	var others, fresh []*v1.Pod
	for uid, p := range want {
		switch {
		case e.workers[uid] != nil:
			out[uid] = p
			if !e.finishedLocked(uid) {
				others = append(others, p)
			}
		case e.rejected[uid].pod == nil:
			fresh = append(fresh, p)
		}
	}
	if len(fresh) == 0 {
		return out
	}
	slices.SortFunc(fresh, func(a, b *v1.Pod) int { return admissionOrder(a, b, ran) })
	node := e.cfg.Node()
	now := e.clock.Now()
	for _, p := range fresh {
		res := e.admitPod(p, others, node)
		if !res.Admitted() {
			e.rejectLocked(p, res, now)
			continue
		}
		out[p.UID] = p
		others = append(others, p)
	}
	return out
}

// admitPod runs the kubelet's admit handlers that apply on this node, in
// its order: sysctls, the node's predicates, AppArmor, then the node
// shutdown manager's. Before the last, a pod asking for a user namespace
// the runtime cannot give is turned away with the kubelet's message (the
// kubelet admits it and then fails its sandbox at every sync). e.mu is
// held.
func (e *Engine) admitPod(pod *v1.Pod, others []*v1.Pod, node *v1.Node) admission.Result {
	if err := checkSysctls(pod, e.cfg.AllowedUnsafeSysctls); err != nil {
		return admission.Result{Reason: admission.ReasonSysctl, Message: "forbidden sysctl: " + err.Error()}
	}
	if r := admission.Pod(pod, others, node); !r.Admitted() {
		return r
	}
	if r := admission.AppArmor(pod, e.cfg.AppArmor); !r.Admitted() {
		return r
	}
	if hostUsersFalse(pod) && !e.cfg.UserNamespaces {
		return admission.Result{Reason: reasonUserNamespacesUnsupported, Message: UserNSUnsupported}
	}
	if e.shuttingDown {
		return admission.Result{Reason: reasonShutdownRejected, Message: shutdownRejectedMessage}
	}
	return admission.Result{}
}

// admissionOrder is the order new pods are admitted in: the kubelet sorts
// them by creation time (static pods have none unless their manifest sets
// one, so its stable sort keeps the sources' order). noderun puts first the
// pods that ran before a restart, so a restart does not hand their place to
// a pod rejected earlier, then sorts by creation time, namespace/name and
// UID: the same answer every time.
func admissionOrder(a, b *v1.Pod, ran map[types.UID]bool) int {
	if ra, rb := ran[a.UID], ran[b.UID]; ra != rb {
		if ra {
			return -1
		}
		return 1
	}
	if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
		return c
	}
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name), cmp.Compare(a.UID, b.UID))
}

// finishedLocked reports whether the pod's status is terminal: the kubelet
// counts no finished pod against the node.
func (e *Engine) finishedLocked(uid types.UID) bool {
	s := e.statuses[uid]
	return s != nil && s.DeletionTimestamp == nil && (s.Status.Phase == v1.PodSucceeded || s.Status.Phase == v1.PodFailed)
}

// rejectLocked records a rejection as the kubelet's rejectPod does: a
// warning event with the reason and message, and the status phase Failed
// with the reason and "Pod was rejected: <message>".
func (e *Engine) rejectLocked(pod *v1.Pod, res admission.Result, now time.Time) {
	e.rejected[pod.UID] = rejection{pod: pod}
	out := pod.DeepCopy()
	start := metav1.NewTime(now)
	out.Status = v1.PodStatus{Phase: v1.PodFailed, Reason: res.Reason, Message: res.StatusMessage(),
		QOSClass: QOSClass(pod), StartTime: &start}
	e.putStatusLocked(pod.UID, out)
	if e.events.record(pod, "", "", v1.EventTypeWarning, res.Reason, res.Message, now) {
		e.log.Warn("pod rejected", "pod", podRef(pod), "reason", res.Reason, "message", res.Message)
	}
}
