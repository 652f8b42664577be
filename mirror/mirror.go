// Package mirror is noderun's mirror mode, the kubelet's side of an API
// server for a node that runs only static pods (--kubeconfig): it
// registers the Node and keeps its status and its Lease fresh, and keeps
// one mirror pod per static pod, with the pod's status written from
// noderun's own. Offline first: it reads the engine through Source and
// never writes to it, so an API server that is down, refuses the
// credentials or speaks an older API slows no pod; each failed call is
// reported (OnResult: metrics and events) and retried at the next turn.
//
// It speaks plain JSON over net/http with k8s.io/api's types, not
// client-go: the few calls it makes do not pay for client-go's typed
// clientsets, rate limiters and kubeconfig loaders in a binary with a
// size budget (see the README's mirror mode section).
package mirror

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
)

// ConfigMirrorAnnotation marks a mirror pod, with its static pod's hash,
// as the kubelet sets it.
const ConfigMirrorAnnotation = "kubernetes.io/config.mirror"

// The kubelet's node lease and status timing: a 40 s lease renewed every
// 10 s (a quarter of it), the node status written when it changes and
// otherwise at least once a minute (the kubelet's is five, with the lease
// as the heartbeat; a minute keeps kubectl's view of the node current).
const (
	LeaseNamespace       = "kube-node-lease"
	leaseDurationSeconds = 40
	renewInterval        = 10 * time.Second
	statusReport         = time.Minute
	// changeDelay spaces the turns a stream of pod changes starts.
	changeDelay = time.Second
)

// Source is the node as the mirror reads it: noderun's engine and node
// reporter.
type Source interface {
	// Pods returns every static pod with its current status.
	Pods() []v1.Pod
	// Changes returns a channel closed when a pod changes.
	Changes() (uint64, <-chan struct{})
	// Ready is closed once every source's pods are known: no mirror pod
	// is judged an orphan before.
	Ready() <-chan struct{}
	// Node returns the node as it is now.
	Node(ctx context.Context) *v1.Node
}

// Config is what a Mirror needs.
type Config struct {
	Kubeconfig string
	NodeName   string
	Source     Source
	Log        *slog.Logger
	Clock      clock.WithTicker
	// KubeletVersion, if set, is the Node's nodeInfo.kubeletVersion: the
	// kubelet release whose behaviour noderun keeps, which kubeadm's
	// version skew checks read (noderun's own version is no kubelet's).
	KubeletVersion string
	// OnResult, if set, is told the outcome of each call by operation
	// (connect, register, node-status, lease, list, create, delete,
	// status).
	OnResult func(op string, err error)
}

// Mirror keeps the API server's view of this node. Run it once.
type Mirror struct {
	cfg       Config
	conn      *connection
	confStamp string
	nodeUID   types.UID
	lease     *coordv1.Lease
	renewed   time.Time
	reported  time.Time
	nodeSeen  string            // the last node status written, without heartbeats
	sent      map[string]string // mirror pod UID: the last status written
	failing   map[string]string // operation: its last error, logged once
}

// New returns a Mirror for cfg.
func New(cfg Config) *Mirror {
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Mirror{cfg: cfg, sent: map[string]string{}, failing: map[string]string{}}
}

// Run keeps the mirror until ctx ends: a turn every renewInterval, and
// one soon after a pod changes.
func (m *Mirror) Run(ctx context.Context) {
	ticker := m.cfg.Clock.NewTicker(renewInterval)
	defer ticker.Stop()
	for {
		_, changed := m.cfg.Source.Changes()
		m.turn(ctx)
		select {
		case <-ctx.Done():
			return
		case <-ticker.C():
		case <-changed:
			select {
			case <-ctx.Done():
				return
			case <-m.cfg.Clock.After(changeDelay):
			}
		}
	}
}

// turn brings the API server up to date as far as it answers: a call
// that gets no answer ends the turn, so that a server that is down costs
// one timeout per turn, not one per pod.
func (m *Mirror) turn(ctx context.Context) {
	if err := m.connect(); err != nil {
		m.result("connect", err)
		return
	}
	if err := m.syncNode(ctx); err != nil {
		return
	}
	// Due at every tick: the last renewal's time was taken after the calls
	// of its turn, a moment after that turn's tick.
	if m.cfg.Clock.Since(m.renewed) >= renewInterval*9/10 {
		if err := m.renewLease(ctx); err != nil && statusCode(err) == 0 {
			return
		}
	}
	select {
	case <-m.cfg.Source.Ready():
		m.syncPods(ctx)
	default:
	}
}

// result reports an operation's outcome, and logs when an operation
// starts failing, fails differently, or recovers.
func (m *Mirror) result(op string, err error) {
	if m.cfg.OnResult != nil {
		m.cfg.OnResult(op, err)
	}
	last, was := m.failing[op]
	switch {
	case err == nil && was:
		delete(m.failing, op)
		m.cfg.Log.Info("mirror: API server call succeeds again", "op", op)
	case err != nil && last != err.Error():
		m.failing[op] = err.Error()
		m.cfg.Log.Warn("mirror: API server call failed; pods are not affected, retrying", "op", op, "err", err)
	}
}

// connect (re)reads the kubeconfig when it is new or changed: kubeadm
// writes kubelet.conf after the node agent has started.
func (m *Mirror) connect() error {
	fi, err := os.Stat(m.cfg.Kubeconfig)
	if err != nil {
		return err
	}
	stamp := fmt.Sprintf("%d/%d", fi.ModTime().UnixNano(), fi.Size())
	if m.conn != nil && stamp == m.confStamp {
		return nil
	}
	conn, err := loadKubeconfig(m.cfg.Kubeconfig)
	if err != nil {
		return err
	}
	m.conn, m.confStamp, m.nodeUID, m.lease = conn, stamp, "", nil
	return nil
}

// syncNode registers the node once per connection and writes its status
// when it changed or is due.
func (m *Mirror) syncNode(ctx context.Context) error {
	node := m.cfg.Source.Node(ctx)
	if m.cfg.KubeletVersion != "" {
		node.Status.NodeInfo.KubeletVersion = m.cfg.KubeletVersion
	}
	if m.nodeUID == "" {
		uid, err := m.register(ctx, node)
		m.result("register", err)
		if err != nil {
			return err
		}
		m.nodeUID, m.nodeSeen = uid, ""
	}
	seen := nodeDigest(node)
	if seen == m.nodeSeen && m.cfg.Clock.Since(m.reported) < statusReport {
		return nil
	}
	patch := map[string]any{"status": map[string]any{
		"conditions": node.Status.Conditions, "addresses": node.Status.Addresses,
		"capacity": node.Status.Capacity, "allocatable": node.Status.Allocatable, "nodeInfo": node.Status.NodeInfo,
	}}
	err := m.conn.call(ctx, "PATCH", "/api/v1/nodes/"+url.PathEscape(m.cfg.NodeName)+"/status", contentMerge, patch, nil)
	m.result("node-status", err)
	if statusCode(err) == 404 {
		m.nodeUID = "" // deleted: register again at the next turn
	}
	if err == nil {
		m.nodeSeen, m.reported = seen, m.cfg.Clock.Now()
	}
	return err
}

// register creates the Node unless it exists, and returns its UID.
func (m *Mirror) register(ctx context.Context, node *v1.Node) (types.UID, error) {
	path := "/api/v1/nodes/" + url.PathEscape(m.cfg.NodeName)
	var got v1.Node
	err := m.conn.call(ctx, "GET", path, "", nil, &got)
	if statusCode(err) == 404 {
		n := &v1.Node{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
			ObjectMeta: metav1.ObjectMeta{Name: m.cfg.NodeName, Labels: node.Labels}, Status: node.Status}
		err = m.conn.call(ctx, "POST", "/api/v1/nodes", contentJSON, n, &got)
		if statusCode(err) == 409 { // registered meanwhile
			err = m.conn.call(ctx, "GET", path, "", nil, &got)
		}
		if err == nil {
			m.cfg.Log.Info("mirror: node registered", "node", m.cfg.NodeName, "server", m.conn.server)
		}
	}
	return got.UID, err
}

// nodeDigest is the node's status without its heartbeat times.
func nodeDigest(node *v1.Node) string {
	st := node.Status.DeepCopy()
	for i := range st.Conditions {
		st.Conditions[i].LastHeartbeatTime = metav1.Time{}
	}
	b, _ := json.Marshal(st)
	return string(b)
}

// renewLease renews the node's Lease in kube-node-lease, creating it
// when missing; a conflict makes the next renewal read it again.
func (m *Mirror) renewLease(ctx context.Context) error {
	path := "/apis/coordination.k8s.io/v1/namespaces/" + LeaseNamespace + "/leases"
	now := metav1.NewMicroTime(m.cfg.Clock.Now())
	var err error
	if m.lease == nil {
		var got coordv1.Lease
		if err = m.conn.call(ctx, "GET", path+"/"+url.PathEscape(m.cfg.NodeName), "", nil, &got); err == nil {
			m.lease = &got
		}
	}
	if statusCode(err) == 404 {
		l := m.newLease()
		l.Spec.RenewTime = &now
		var got coordv1.Lease
		if err = m.conn.call(ctx, "POST", path, contentJSON, l, &got); err == nil {
			m.lease, m.renewed = &got, now.Time
		}
		m.result("lease", err)
		return err
	}
	if err == nil {
		l := m.lease.DeepCopy()
		want := m.newLease()
		l.Spec, l.OwnerReferences = want.Spec, want.OwnerReferences
		l.Spec.RenewTime = &now
		var got coordv1.Lease
		if err = m.conn.call(ctx, "PUT", path+"/"+url.PathEscape(m.cfg.NodeName), contentJSON, l, &got); err == nil {
			m.lease, m.renewed = &got, now.Time
		}
	}
	if statusCode(err) == 409 {
		m.lease = nil
	}
	m.result("lease", err)
	return err
}

// newLease is the node's Lease as the kubelet makes it, owned by its Node.
func (m *Mirror) newLease() *coordv1.Lease {
	d := int32(leaseDurationSeconds)
	holder := m.cfg.NodeName
	return &coordv1.Lease{
		TypeMeta:   metav1.TypeMeta{APIVersion: "coordination.k8s.io/v1", Kind: "Lease"},
		ObjectMeta: metav1.ObjectMeta{Name: m.cfg.NodeName, Namespace: LeaseNamespace, OwnerReferences: m.ownerRefs(false)},
		Spec:       coordv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &d},
	}
}

// ownerRefs names the Node as owner, as the kubelet does for its lease
// and (as controller) its mirror pods, so that deleting the Node removes
// what the node made.
func (m *Mirror) ownerRefs(controller bool) []metav1.OwnerReference {
	ref := metav1.OwnerReference{APIVersion: "v1", Kind: "Node", Name: m.cfg.NodeName, UID: m.nodeUID}
	if controller {
		ref.Controller = &controller
	}
	return []metav1.OwnerReference{ref}
}
