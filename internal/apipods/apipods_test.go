package apipods

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/noderun/noderun/manifests"
)

// fakeStatuses is the engine's status board: set replaces the pods and
// wakes those waiting on Changes.
type fakeStatuses struct {
	mu      sync.Mutex
	pods    []v1.Pod
	changed chan struct{}
}

func (f *fakeStatuses) Pods() []v1.Pod {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pods
}

func (f *fakeStatuses) Changes() (uint64, <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.changed == nil {
		f.changed = make(chan struct{})
	}
	return 0, f.changed
}

func (f *fakeStatuses) set(pods ...v1.Pod) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pods = pods
	if f.changed != nil {
		close(f.changed)
		f.changed = nil
	}
}

// debugger is the pod kubectl debug node/n1 builds (general profile).
func debugger() *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "node-debugger-n1-abcde", Labels: map[string]string{"app.kubernetes.io/managed-by": "kubectl-debug"}},
		Spec: v1.PodSpec{
			NodeName: "n1", RestartPolicy: v1.RestartPolicyNever, HostNetwork: true, HostPID: true, HostIPC: true,
			Tolerations: []v1.Toleration{{Operator: v1.TolerationOpExists}},
			Volumes:     []v1.Volume{{Name: "host-root", VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: "/"}}}},
			Containers: []v1.Container{{Name: "debugger", Image: "busybox", Stdin: true, TTY: true, TerminationMessagePolicy: v1.TerminationMessageReadFile,
				VolumeMounts: []v1.VolumeMount{{Name: "host-root", MountPath: "/host"}}}},
		},
	}
}

func TestCreateRefusesOtherPods(t *testing.T) {
	s, err := New("n1", t.TempDir(), &fakeStatuses{}, clocktesting.NewFakeClock(time.Now()), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		mod  func(*v1.Pod)
		want string
	}{
		{"no label", func(p *v1.Pod) { p.Labels = nil }, "app.kubernetes.io/managed-by=kubectl-debug"},
		{"another name", func(p *v1.Pod) { p.Name = "web" }, `metadata.name "web" is not node-debugger-n1-<suffix>`},
		{"another node", func(p *v1.Pod) { p.Spec.NodeName = "n2" }, `spec.nodeName "n2"`},
		{"restarted", func(p *v1.Pod) { p.Spec.RestartPolicy = v1.RestartPolicyAlways }, "restartPolicy is Never"},
		{"two containers", func(p *v1.Pod) { p.Spec.Containers = append(p.Spec.Containers, p.Spec.Containers[0]) }, "one container"},
		{"another namespace", func(p *v1.Pod) { p.Namespace = "kube-system" }, `metadata.namespace "kube-system"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := debugger()
			tt.mod(p)
			_, _, err := s.Create("default", p)
			var refused *RefusedError
			if !errors.As(err, &refused) || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "kubectl debug node/n1") {
				t.Errorf("%v, want refused with %q", err, tt.want)
			}
		})
	}
	p := debugger()
	p.Spec.Containers[0].Image = ""
	if _, _, err := s.Create("default", p); !errors.As(err, new(*InvalidError)) {
		t.Errorf("no image: %v, want invalid", err)
	}
}

// A created pod is in the next snapshot and on disk, so a new Source
// (a restarted noderun) has it; once it has ended it stays Linger, then
// goes; Delete removes one at once.
func TestLifecycle(t *testing.T) {
	dir, clk, st := t.TempDir(), clocktesting.NewFakeClock(time.Now()), &fakeStatuses{}
	log := slog.New(slog.DiscardHandler)
	s, err := New("n1", dir, st, clk, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	snaps := make(chan manifests.Snapshot)
	go s.Run(ctx, snaps)
	if snap := <-snaps; snap.Source != SourceName || len(snap.Pods) != 0 {
		t.Fatalf("first snapshot %+v, want api: and empty", snap)
	}
	pod, _, err := s.Create("default", debugger())
	if err != nil {
		t.Fatal(err)
	}
	if pod.Namespace != "default" || pod.UID == "" || pod.Annotations[manifests.ConfigSourceAnnotation] != "api" {
		t.Errorf("created %+v", pod.ObjectMeta)
	}
	if _, _, err := s.Create("default", debugger()); !errors.Is(err, ErrExists) {
		t.Errorf("the same name again: %v, want ErrExists", err)
	}
	if snap := <-snaps; len(snap.Pods) != 1 || snap.Pods[0].UID != pod.UID {
		t.Fatalf("snapshot after Create: %+v", snap.Pods)
	}
	again, err := New("n1", dir, st, clk, log)
	if err != nil || len(again.snapshot().Pods) != 1 {
		t.Fatalf("a new source from the dir: %v, %+v", err, again.snapshot().Pods)
	}

	ended := *pod
	ended.Status.Phase = v1.PodSucceeded
	st.set(ended)
	waitForTimers(t, clk) // the source saw it end
	clk.Step(Linger - time.Second)
	select {
	case snap := <-snaps:
		t.Fatalf("removed before its linger: %+v", snap.Pods)
	default:
	}
	clk.Step(time.Second)
	if snap := <-snaps; len(snap.Pods) != 0 {
		t.Fatalf("after its linger: %+v, want it gone", snap.Pods)
	}
	if again, _ := New("n1", dir, st, clk, log); len(again.snapshot().Pods) != 0 {
		t.Error("the ended pod's file is still there")
	}

	p2 := debugger()
	p2.Name = "node-debugger-n1-fghij"
	if _, _, err := s.Create("default", p2); err != nil {
		t.Fatal(err)
	}
	<-snaps
	if _, err := s.Delete("default", p2.Name); err != nil {
		t.Fatal(err)
	}
	if snap := <-snaps; len(snap.Pods) != 0 {
		t.Fatalf("after Delete: %+v", snap.Pods)
	}
	if _, err := s.Delete("default", p2.Name); !errors.Is(err, ErrNotFound) {
		t.Errorf("deleted twice: %v, want ErrNotFound", err)
	}
}

// waitForTimers waits until the source has set its linger timer.
func waitForTimers(t *testing.T, clk *clocktesting.FakeClock) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !clk.HasWaiters() {
		if time.Now().After(deadline) {
			t.Fatal("the source set no timer for the ended pod")
		}
		time.Sleep(time.Millisecond)
	}
}
