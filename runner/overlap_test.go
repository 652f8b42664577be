package runner

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// TestPrecreateWhileNetworkSetsUp: a new pod's containers are created while
// its network is attached, and none starts before Setup returned.
func TestPrecreateWhileNetworkSetsUp(t *testing.T) {
	f := startEngine(t)
	gate := make(chan struct{})
	f.net.mu.Lock()
	f.net.setupGate = gate
	f.net.mu.Unlock()
	pod := testPod("u1", "web", v1.RestartPolicyAlways)
	pod.Spec.Containers = append(pod.Spec.Containers, v1.Container{Name: "side", Image: "busybox:1.36"})
	f.send(pod)
	created := func() []string { f.rt.mu.Lock(); defer f.rt.mu.Unlock(); return slices.Clone(f.rt.created) }
	waitFor(t, "both created during Setup", func() bool { return len(created()) == 2 })
	if n := f.rt.startedCount(); n != 0 {
		t.Fatalf("%d containers started before the network was set up", n)
	}
	close(gate)
	waitFor(t, "both started", func() bool { return f.rt.startedCount() == 2 })
	if got := created(); len(got) != 2 {
		t.Errorf("containers created %v, want each once", got)
	}
	if n := f.rt.startedCount(); n != 2 {
		t.Errorf("%d starts, want 2", n)
	}
}

// holdGate returns a gate that stays shut until release, or the test's end
// (before the engine stops, so a failed test does not hang).
func holdGate(t *testing.T) (chan struct{}, func()) {
	gate := make(chan struct{})
	release := sync.OnceFunc(func() { close(gate) })
	t.Cleanup(release)
	return gate, release
}

// TestPrecreateRecordsBeforeThePin: a new pod's container records are made
// while its namespaces are pinned, and its tasks only once they are.
func TestPrecreateRecordsBeforeThePin(t *testing.T) {
	f := startEngine(t)
	gate, release := holdGate(t)
	f.net.mu.Lock()
	f.net.pinGate = gate
	f.net.mu.Unlock()
	f.send(testPod("u1", "web", v1.RestartPolicyAlways))
	waitFor(t, "recorded during the pin", func() bool { return f.rt.count(&f.rt.records) == 1 })
	// Given time, a task not waiting for the pin would be made now.
	time.Sleep(50 * time.Millisecond)
	if created := f.rt.count(&f.rt.created); created != 0 {
		t.Fatalf("%d tasks created before the namespaces were pinned", created)
	}
	release()
	waitFor(t, "started", func() bool { return f.rt.startedCount() == 1 })
	f.rt.mu.Lock()
	defer f.rt.mu.Unlock()
	if len(f.rt.created) != 1 || len(f.rt.records) != 1 {
		t.Errorf("records %v, created %v: want the one container once", f.rt.records, f.rt.created)
	}
}

// TestPrecreateChecksImagesDuringTheListing: a new pod's images are looked
// up while it is listed, and nothing is created before the listing says
// the pod has no containers.
func TestPrecreateChecksImagesDuringTheListing(t *testing.T) {
	f := startEngine(t)
	gate, release := holdGate(t)
	f.rt.mu.Lock()
	f.rt.listGate = gate
	f.rt.mu.Unlock()
	pod := testPod("u1", "web", v1.RestartPolicyAlways)
	pod.Spec.Containers = append(pod.Spec.Containers, v1.Container{Name: "side", Image: "busybox:1.36"})
	f.send(pod)
	checks := func() int { f.rt.mu.Lock(); defer f.rt.mu.Unlock(); return f.rt.neverChecks }
	waitFor(t, "both images checked during the listing", func() bool { return checks() == 2 })
	if records := f.rt.count(&f.rt.records); records != 0 {
		t.Fatalf("%d containers recorded before the listing returned", records)
	}
	release()
	waitFor(t, "both started", func() bool { return f.rt.startedCount() == 2 })
}

// TestPrecreateWhenThePinFails: a pin that fails leaves no container made
// for it; Setup is asked, as without precreation, and reports the failure.
func TestPrecreateWhenThePinFails(t *testing.T) {
	f := startEngine(t)
	f.net.mu.Lock()
	f.net.pinErr = errors.New("no netns")
	f.net.setupErr = errors.New("setup: no netns")
	f.net.mu.Unlock()
	f.send(testPod("u1", "web", v1.RestartPolicyAlways))
	waitFor(t, "the setup's failure reported", func() bool {
		p := f.status("u1")
		if p == nil {
			return false
		}
		for _, c := range p.Status.Conditions {
			if c.Type == v1.PodReadyToStartContainers && c.Status == v1.ConditionFalse && strings.Contains(c.Message, "setup: no netns") {
				return true
			}
		}
		return false
	})
	f.rt.mu.Lock()
	defer f.rt.mu.Unlock()
	if len(f.rt.records) == 0 {
		t.Fatal("no container recorded while the namespaces were pinned")
	}
	if len(f.rt.created) != 0 || len(f.rt.containers) != 0 {
		t.Errorf("created %v, containers %v: want nothing left of a failed pin", f.rt.created, f.rt.containers)
	}
}

// TestPrecreatedPodListedAndCheckedOnce: a new pod whose containers were
// precreated is listed once (beside its namespaces) and its image checked
// once (at creation, never pulled), not again before the start.
func TestPrecreatedPodListedAndCheckedOnce(t *testing.T) {
	f := startEngine(t)
	f.send(testPod("u1", "web", v1.RestartPolicyAlways))
	waitFor(t, "started", func() bool { return f.rt.startedCount() == 1 })
	f.rt.mu.Lock()
	defer f.rt.mu.Unlock()
	if len(f.rt.created) != 1 {
		t.Fatalf("created %v, want the one container precreated", f.rt.created)
	}
	if got := f.rt.listsAtStart[0]; got != 1 {
		t.Errorf("%d container listings before the start, want 1", got)
	}
	if got := f.rt.ensuresAtStart[0]; got != 0 {
		t.Errorf("%d image checks that could pull before the start, want 0 (only the creation's, PullNever)", got)
	}
}

// TestPrecreateRedoneWhenTheIPMatters: a container whose env names
// status.podIP is created again once the IP is known.
func TestPrecreateRedoneWhenTheIPMatters(t *testing.T) {
	f := startEngine(t)
	pod := testPod("u1", "web", v1.RestartPolicyAlways)
	pod.Spec.Containers[0].Env = append(pod.Spec.Containers[0].Env, v1.EnvVar{Name: "IP",
		ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "status.podIP"}}})
	f.send(pod)
	waitFor(t, "started", func() bool { return f.rt.startedCount() == 1 })
	cfg := f.startedConfig("main", 0)
	if !slices.Contains(cfg.Env, "IP=10.0.0.2") {
		t.Errorf("env %v lacks the pod IP", cfg.Env)
	}
	f.rt.mu.Lock()
	created, state := len(f.rt.created), f.rt.containers[cfg.ID].State
	f.rt.mu.Unlock()
	// The start made it anew (the fake refuses a duplicate), so the
	// precreated one, made without the IP, was removed.
	if created != 1 || state != StateRunning {
		t.Errorf("precreated %d times, state %v; want once, then started anew", created, state)
	}
}

// TestNoPrecreateForHostNetwork: nothing to overlap, and Pin is not asked.
func TestNoPrecreateForHostNetwork(t *testing.T) {
	f := startEngine(t)
	pod := testPod("u1", "web", v1.RestartPolicyAlways)
	pod.Spec.HostNetwork = true
	f.send(pod)
	waitFor(t, "started", func() bool { return f.rt.startedCount() == 1 })
	f.net.mu.Lock()
	defer f.net.mu.Unlock()
	if f.net.pins != 0 {
		t.Errorf("Pin called %d times for a hostNetwork pod", f.net.pins)
	}
}

// TestPrecreateInitContainers: init containers and app containers are all
// created during Setup, then started one after another as the kubelet's
// order asks, each from its precreated container.
func TestPrecreateInitContainers(t *testing.T) {
	f := startEngine(t)
	pod := testPod("u1", "web", v1.RestartPolicyAlways)
	pod.Spec.InitContainers = []v1.Container{{Name: "i0", Image: "busybox:1.36"}, {Name: "i1", Image: "busybox:1.36"}}
	f.send(pod)
	waitFor(t, "i0 started", func() bool { return f.rt.startedCount() == 1 })
	f.rt.mu.Lock()
	created := len(f.rt.created)
	f.rt.mu.Unlock()
	if created != 3 {
		t.Fatalf("%d containers created with the sandbox, want 3", created)
	}
	if p := f.status("u1"); p == nil || len(p.Status.InitContainerStatuses) != 2 || p.Status.InitContainerStatuses[1].State.Waiting == nil ||
		p.Status.InitContainerStatuses[1].RestartCount != 0 {
		t.Fatalf("the waiting init container must not show as a run: %+v", p.Status.InitContainerStatuses)
	}
	for i, id := range []string{ContainerID("u1", "i0", 0), ContainerID("u1", "i1", 0)} {
		f.rt.exit(id, 0)
		waitFor(t, "next started", func() bool { return f.rt.startedCount() == i+2 })
	}
	if got := f.startedNames(); !slices.Equal(got, []string{"i0", "i1", "main"}) {
		t.Errorf("started %v, want i0 i1 main in order", got)
	}
	f.rt.mu.Lock()
	defer f.rt.mu.Unlock()
	if len(f.rt.created) != 3 {
		t.Errorf("containers created %v, want each once", f.rt.created)
	}
}

// TestPrecreatedRemovedWhenThePodFails: a Never pod whose init container
// fails will not start its app container; the precreated one goes.
func TestPrecreatedRemovedWhenThePodFails(t *testing.T) {
	f := startEngine(t)
	pod := testPod("u1", "web", v1.RestartPolicyNever)
	pod.Spec.InitContainers = []v1.Container{{Name: "i0", Image: "busybox:1.36"}}
	f.send(pod)
	waitFor(t, "i0 started", func() bool { return f.rt.startedCount() == 1 })
	f.rt.exit(ContainerID("u1", "i0", 0), 1)
	app := ContainerID("u1", "main", 0)
	waitFor(t, "precreated app removed", func() bool {
		f.rt.mu.Lock()
		defer f.rt.mu.Unlock()
		return f.rt.containers[app] == nil
	})
	if n := f.rt.startedCount(); n != 1 {
		t.Errorf("%d started, want only the init container", n)
	}
}

// TestCreatedRunKeepsItsRestartCount: a container made but never started
// (noderun stopped while it was precreated) is started under its own
// restart count, not counted as a run that ended.
func TestCreatedRunKeepsItsRestartCount(t *testing.T) {
	f := startEngine(t, ContainerStatus{ID: ContainerID("u1", "main", 0), PodUID: "u1", PodName: "web-n1", PodNamespace: "default",
		Name: "main", State: StateCreated, SpecHash: specHash(&testPod("u1", "web", v1.RestartPolicyAlways).Spec.Containers[0])})
	f.send(testPod("u1", "web", v1.RestartPolicyAlways))
	waitFor(t, "started", func() bool { return f.rt.startedCount() == 1 })
	if cfg := f.startedConfig("main", 0); cfg == nil || cfg.LastState != nil {
		t.Fatalf("started %+v, want restart 0 with no last state", f.startedNames())
	}
	waitFor(t, "running with no restart", func() bool {
		p := f.status("u1")
		return p != nil && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Running != nil &&
			p.Status.ContainerStatuses[0].RestartCount == 0
	})
}
