package runner

import (
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/noderun/noderun/internal/admission"
)

// admitNode is a node of 2 CPUs and 110 pods, labelled disk=ssd.
func admitNode(cfg *Config) {
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: admission.NodeLabels("n1", map[string]string{"disk": "ssd"})},
		Status: v1.NodeStatus{Allocatable: v1.ResourceList{
			v1.ResourceCPU: resource.MustParse("2"), v1.ResourcePods: resource.MustParse("110"),
			v1.ResourceMemory: resource.MustParse("1Gi"),
		}}}
	cfg.Node = func() *v1.Node { return node }
}

func cpuPod(uid, name, cpu string, policy v1.RestartPolicy) *v1.Pod {
	p := testPod(uid, name, policy)
	p.Spec.Containers[0].Resources.Requests = v1.ResourceList{v1.ResourceCPU: resource.MustParse(cpu)}
	return p
}

func (r *fakeRuntime) startedPod(uid string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.ContainsFunc(r.started, func(c *ContainerConfig) bool { return string(c.Pod.UID) == uid })
}

func (f *engineFixture) hasPodEvent(uid, reason, msg string) bool {
	return slices.ContainsFunc(f.e.Events(), func(ev v1.Event) bool {
		return string(ev.InvolvedObject.UID) == uid && ev.Reason == reason && ev.Message == msg && ev.Type == v1.EventTypeWarning
	})
}

// wantRejected waits for the pod's Failed status with the kubelet's reason
// and message, and checks that nothing of it was made.
func (f *engineFixture) wantRejected(t *testing.T, uid, reason, msg string) {
	t.Helper()
	waitFor(t, uid+" rejected", func() bool {
		s := f.status(uid)
		return s != nil && s.Status.Phase == v1.PodFailed && s.Status.Reason == reason
	})
	s := f.status(uid).Status
	if s.Message != "Pod was rejected: "+msg || s.StartTime == nil || len(s.ContainerStatuses) != 0 {
		t.Errorf("%s status = %+v, want message %q, a start time and no container status", uid, s, "Pod was rejected: "+msg)
	}
	if !f.hasPodEvent(uid, reason, msg) {
		t.Errorf("no %s event %q for %s in %+v", reason, msg, uid, f.e.Events())
	}
	if f.net.setupCount(uid) != 0 || f.rt.startedPod(uid) {
		t.Errorf("%s: a sandbox or container was made for a rejected pod", uid)
	}
}

func TestEngineAdmission(t *testing.T) {
	f := startEngineWith(t, admitNode)
	a := cpuPod("a", "a", "1500m", v1.RestartPolicyAlways)
	f.send(a)
	waitFor(t, "a started", func() bool { return f.rt.startedPod("a") })

	b := cpuPod("b", "b", "1", v1.RestartPolicyAlways)
	c := testPod("c", "c", v1.RestartPolicyAlways)
	c.Spec.NodeSelector = map[string]string{"disk": "hdd"}
	sysctl := testPod("s", "s", v1.RestartPolicyAlways)
	sysctl.Spec.SecurityContext = &v1.PodSecurityContext{Sysctls: []v1.Sysctl{{Name: "kernel.msgmax", Value: "1"}}}
	f.send(a, b, c, sysctl)
	f.wantRejected(t, "b", "OutOfcpu", "Node didn't have enough resource: cpu, requested: 1000, used: 1500, capacity: 2000")
	f.wantRejected(t, "c", "NodeAffinity", "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector")
	f.wantRejected(t, "s", "SysctlForbidden", `forbidden sysctl: "kernel.msgmax" not allowlisted`)

	// a goes: its CPU is free again, but b stays rejected until its
	// manifest changes, as under the kubelet; a new pod gets the CPU.
	d := cpuPod("d", "d", "1500m", v1.RestartPolicyAlways)
	f.send(b, c, d)
	waitFor(t, "d started", func() bool { return f.rt.startedPod("d") })
	if s := f.status("b"); s == nil || s.Status.Reason != "OutOfcpu" || f.rt.startedPod("b") {
		t.Fatalf("b after a went: %+v, want still rejected", s)
	}

	// c's manifest is fixed (metadata.uid kept): admitted and run. b is
	// removed: its status goes.
	fixed := c.DeepCopy()
	fixed.Spec.NodeSelector = map[string]string{"disk": "ssd"}
	f.send(fixed, d)
	waitFor(t, "fixed c started", func() bool { return f.rt.startedPod("c") })
	waitFor(t, "b's status gone", func() bool { return f.status("b") == nil })
}

// A pod that has finished takes nothing from the node: the kubelet counts
// only pods that are not terminal.
func TestEngineAdmissionSkipsFinishedPods(t *testing.T) {
	f := startEngineWith(t, admitNode)
	done := cpuPod("done", "done", "2", v1.RestartPolicyNever)
	f.send(done)
	waitFor(t, "done started", func() bool { return f.rt.startedCount() == 1 })
	f.rt.exit(f.rt.started[0].ID, 0)
	waitFor(t, "done Succeeded", func() bool {
		s := f.status("done")
		return s != nil && s.Status.Phase == v1.PodSucceeded
	})
	f.send(done, cpuPod("next", "next", "2", v1.RestartPolicyAlways))
	waitFor(t, "next started", func() bool { return f.rt.startedPod("next") })
}

func TestAdmissionOrder(t *testing.T) {
	pod := func(uid, name string, created int64) *v1.Pod {
		p := testPod(uid, name, v1.RestartPolicyAlways)
		if created > 0 {
			p.CreationTimestamp = metav1.Unix(created, 0)
		}
		return p
	}
	pods := []*v1.Pod{pod("u1", "b", 0), pod("u2", "a", 0), pod("u3", "c", 5), pod("u4", "d", 1), pod("u5", "z", 0)}
	ran := map[types.UID]bool{"u5": true}
	slices.SortFunc(pods, func(a, b *v1.Pod) int { return admissionOrder(a, b, ran) })
	var got []string
	for _, p := range pods {
		got = append(got, p.Name)
	}
	// Ran before a restart first; then no creation time (static pods'),
	// then by time; ties by name.
	if want := []string{"z-n1", "a-n1", "b-n1", "d-n1", "c-n1"}; !slices.Equal(got, want) {
		t.Errorf("order %v, want %v", got, want)
	}
}

// The AppArmor admit handler runs after the node's predicates, on the
// host fact the engine was given: without AppArmor a confined pod is
// rejected, with it the same pod runs.
func TestEngineAdmissionAppArmor(t *testing.T) {
	confined := func(uid string) *v1.Pod {
		p := testPod(uid, uid, v1.RestartPolicyAlways)
		p.Spec.SecurityContext = &v1.PodSecurityContext{AppArmorProfile: &v1.AppArmorProfile{Type: v1.AppArmorProfileTypeRuntimeDefault}}
		return p
	}
	f := startEngineWith(t, admitNode)
	both := confined("both")
	both.Spec.NodeSelector = map[string]string{"disk": "hdd"}
	f.send(confined("aa"), both)
	f.wantRejected(t, "aa", "AppArmor", "Cannot enforce AppArmor: AppArmor is not enabled on the host")
	f.wantRejected(t, "both", "NodeAffinity", "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector")

	g := startEngineWith(t, func(cfg *Config) { admitNode(cfg); cfg.AppArmor = true })
	g.send(confined("aa"))
	waitFor(t, "aa started where AppArmor is enabled", func() bool { return g.rt.startedPod("aa") })
}

// A pod asking for a user namespace on a runtime without them is turned
// away with the kubelet's message; with them it runs, in its own range.
func TestEngineAdmissionUserNamespaces(t *testing.T) {
	userns := func(uid string) *v1.Pod {
		p := testPod(uid, uid, v1.RestartPolicyAlways)
		p.Spec.HostUsers = new(bool)
		return p
	}
	f := startEngineWith(t, admitNode)
	f.send(userns("u"))
	f.wantRejected(t, "u", "UserNamespacesUnsupported", "can't set `spec.hostUsers: false`, runtime does not support user namespaces")

	g := startEngineWith(t, func(cfg *Config) { admitNode(cfg); cfg.UserNamespaces = true })
	g.send(userns("u"))
	waitFor(t, "u started where the runtime has user namespaces", func() bool { return g.rt.startedPod("u") })
	if m := g.e.env.userns.kept("u"); m == nil || m.HostID < 65536 || m.HostID%65536 != 0 || m.Length != 65536 {
		t.Errorf("range %+v, want 65536 IDs from a multiple of 65536", m)
	}
}
