// Package apipods is the node's one kind of pod made through its API
// rather than a manifest: the debugger pod `kubectl debug node/<node>`
// creates (a privileged pod in the host's namespaces with the host's root
// at /host, as kubectl builds it). It is a manifest source like the others
// (full snapshots, source "api:"), keeps its pods in a dir of their own so
// a restarted noderun adopts them, and removes a pod once it has ended
// (the debugging session is over) or is deleted. Every other pod comes
// from manifests, and is refused here.
package apipods

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/noderun/noderun/internal/atomicfile"
	"github.com/noderun/noderun/manifests"
)

// SourceName names the source in snapshots, /manifests and conflicts.
const SourceName = "api:"

// Linger is how long an ended debugger pod stays: kubectl debug reads a
// run that ended before it could attach from its log.
const Linger = 30 * time.Second

// Errors of Create and Delete.
var (
	ErrExists   = errors.New("already exists") // a pod of that name runs
	ErrNotFound = errors.New("not found")      // no API-made pod of that name
)

// RefusedError: not a pod this node makes through its API; Message says
// which it makes.
type RefusedError struct{ Message string }

func (e *RefusedError) Error() string { return e.Message }

// InvalidError lists the fields a created pod gets wrong.
type InvalidError struct{ Errs []error }

func (e *InvalidError) Error() string    { return errors.Join(e.Errs...).Error() }
func (e *InvalidError) Invalid() []error { return e.Errs }

// Statuses is the engine as the source reads it: each pod's status, and a
// channel closed at its next change.
type Statuses interface {
	Pods() []v1.Pod
	Changes() (uint64, <-chan struct{})
}

// Source holds the API-made pods.
type Source struct {
	node   string
	dir    string
	status Statuses
	clock  clock.Clock
	log    *slog.Logger

	mu    sync.Mutex
	pods  map[types.UID]*v1.Pod
	ended map[types.UID]time.Time // when each was first seen ended
	wake  chan struct{}           // one slot: pods changed
}

// New returns the source of node's API-made pods, with those kept in dir.
func New(node, dir string, st Statuses, clk clock.Clock, log *slog.Logger) (*Source, error) {
	s := &Source{node: node, dir: dir, status: st, clock: clk, log: log,
		pods: map[types.UID]*v1.Pod{}, ended: map[types.UID]time.Time{}, wake: make(chan struct{}, 1)}
	ents, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		var p v1.Pod
		if err == nil {
			err = json.Unmarshal(b, &p)
		}
		if err == nil {
			err = manifests.CheckUID(string(p.UID))
		}
		if err != nil {
			log.Error("API-made pod not adopted", "file", e.Name(), "err", err)
			continue
		}
		s.pods[p.UID] = &p
	}
	return s, nil
}

// Run sends a snapshot now and at each change until ctx ends, and
// removes the pods that ended Linger ago. It follows the engine's
// statuses only while it holds pods: an idle node pays nothing.
func (s *Source) Run(ctx context.Context, snaps chan<- manifests.Snapshot) {
	for send := true; ; send = s.wait(ctx) {
		if ctx.Err() != nil {
			return
		}
		if !send {
			continue
		}
		select {
		case snaps <- s.snapshot():
		case <-ctx.Done():
			return
		}
	}
}

// wait returns true when the pods changed, false when a status changed or
// an ended pod's linger ran out (reap looks again) or ctx ended.
func (s *Source) wait(ctx context.Context) bool {
	var changed <-chan struct{}
	var fire <-chan time.Time
	if s.count() > 0 {
		_, changed = s.status.Changes()
		if next, ok := s.reap(); ok {
			t := s.clock.NewTimer(next)
			defer t.Stop()
			fire = t.C()
		}
	}
	select {
	case <-ctx.Done():
	case <-s.wake:
		return true
	case <-changed:
	case <-fire:
	}
	return false
}

func (s *Source) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pods)
}

func (s *Source) snapshot() manifests.Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	snap := manifests.Snapshot{Source: SourceName, Info: manifests.SourceInfo{Source: SourceName, Kind: "api", Pods: []manifests.PodInfo{}}}
	for _, p := range s.pods {
		snap.Pods = append(snap.Pods, p)
		snap.Info.Pods = append(snap.Info.Pods, manifests.PodInfo{Namespace: p.Namespace, Name: p.Name, UID: p.UID, Hash: string(p.UID)})
	}
	slices.SortFunc(snap.Pods, func(a, b *v1.Pod) int { return strings.Compare(a.Name, b.Name) })
	return snap
}

func (s *Source) changed() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// reap removes the pods whose status has been Succeeded or Failed for
// Linger, and returns when the next one is due.
func (s *Source) reap() (next time.Duration, ok bool) {
	phase := map[types.UID]v1.PodPhase{}
	for _, p := range s.status.Pods() {
		phase[p.UID] = p.Status.Phase
	}
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	removed := false
	for uid, p := range s.pods {
		if ph := phase[uid]; ph != v1.PodSucceeded && ph != v1.PodFailed {
			continue
		}
		at, seen := s.ended[uid]
		if !seen {
			at, s.ended[uid] = now, now
		}
		if left := at.Add(Linger).Sub(now); left > 0 {
			if !ok || left < next {
				next, ok = left, true
			}
			continue
		}
		s.log.Info("debugger pod ended; removing it", "pod", p.Namespace+"/"+p.Name)
		s.removeLocked(uid)
		removed = true
	}
	if removed {
		s.changed()
	}
	return next, ok
}

func (s *Source) removeLocked(uid types.UID) {
	delete(s.pods, uid)
	delete(s.ended, uid)
	if err := os.Remove(filepath.Join(s.dir, string(uid)+".json")); err != nil && !errors.Is(err, os.ErrNotExist) {
		s.log.Warn("API-made pod's file not removed", "uid", uid, "err", err)
	}
}

// Create runs pod in namespace if it is the debugger pod kubectl debug
// node/<node> makes for this node, checked, defaulted and admitted as a
// manifest's pod. It returns the pod as created and the ignored fields.
func (s *Source) Create(namespace string, pod *v1.Pod) (*v1.Pod, []error, error) {
	if err := s.debuggerPod(namespace, pod); err != nil {
		return nil, nil, err
	}
	errs, warnings := manifests.CheckPod(pod)
	if len(errs) > 0 {
		return nil, warnings, &InvalidError{errs}
	}
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	pod.UID = types.UID(hex.EncodeToString(b))
	pod.CreationTimestamp = metav1.NewTime(s.clock.Now().Truncate(time.Second))
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[manifests.ConfigSourceAnnotation] = "api"
	pod.Annotations[manifests.ConfigHashAnnotation] = string(pod.UID)
	s.mu.Lock()
	defer s.mu.Unlock()
	taken := slices.ContainsFunc(s.status.Pods(), func(p v1.Pod) bool { return p.Namespace == pod.Namespace && p.Name == pod.Name })
	for _, p := range s.pods {
		taken = taken || p.Namespace == pod.Namespace && p.Name == pod.Name
	}
	if taken {
		return nil, warnings, fmt.Errorf("%w: pods %q", ErrExists, pod.Name)
	}
	b, err := json.Marshal(pod)
	if err == nil {
		err = os.MkdirAll(s.dir, 0o700)
	}
	if err == nil {
		err = atomicfile.WriteFile(filepath.Join(s.dir, string(pod.UID)+".json"), b, 0o600)
	}
	if err != nil {
		return nil, warnings, fmt.Errorf("keep pod %s: %w", pod.Name, err)
	}
	s.pods[pod.UID] = pod
	s.log.Info("debugger pod created through the API", "pod", pod.Namespace+"/"+pod.Name, "uid", pod.UID)
	s.changed()
	return pod.DeepCopy(), warnings, nil
}

// debuggerPod refuses any pod but the shape kubectl debug node/<node>
// builds for this node: its label and name, one container, never
// restarted. Its profile decides the rest (host namespaces, privileges),
// which the checks of any pod then apply to.
func (s *Source) debuggerPod(namespace string, pod *v1.Pod) error {
	why := func(msg string) error {
		return &RefusedError{fmt.Sprintf("noderun makes a pod through its API only for `kubectl debug node/%s` (%s); other pods come from manifests", s.node, msg)}
	}
	switch {
	case pod.Namespace != "" && pod.Namespace != namespace:
		return why(fmt.Sprintf("metadata.namespace %q is not the request's %q", pod.Namespace, namespace))
	case pod.Labels["app.kubernetes.io/managed-by"] != "kubectl-debug":
		return why("its label app.kubernetes.io/managed-by=kubectl-debug is missing")
	case !strings.HasPrefix(pod.Name, "node-debugger-"+s.node+"-"):
		return why(fmt.Sprintf("metadata.name %q is not node-debugger-%s-<suffix>", pod.Name, s.node))
	case pod.Spec.NodeName != s.node:
		return why(fmt.Sprintf("spec.nodeName %q is not this node", pod.Spec.NodeName))
	case len(pod.Spec.Containers) != 1 || len(pod.Spec.InitContainers) > 0 || len(pod.Spec.EphemeralContainers) > 0:
		return why("it has one container")
	case pod.Spec.RestartPolicy != v1.RestartPolicyNever:
		return why("its restartPolicy is Never")
	}
	pod.Namespace = namespace
	return nil
}

// Delete removes the API-made pod namespace/name and returns it.
func (s *Source) Delete(namespace, name string) (*v1.Pod, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for uid, p := range s.pods {
		if p.Namespace == namespace && p.Name == name {
			s.removeLocked(uid)
			s.log.Info("debugger pod deleted through the API", "pod", namespace+"/"+name)
			s.changed()
			return p, nil
		}
	}
	return nil, fmt.Errorf("%w: pods %q", ErrNotFound, name)
}
