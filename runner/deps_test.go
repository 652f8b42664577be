package runner

import (
	"os"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/noderun/noderun/manifests"
)

func TestUnmetDependencies(t *testing.T) {
	ready := &v1.Pod{Status: v1.PodStatus{Phase: v1.PodRunning,
		Conditions:        []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue}},
		ContainerStatuses: []v1.ContainerStatus{{Started: new(true)}}}}
	started := &v1.Pod{Status: v1.PodStatus{Phase: v1.PodRunning,
		Conditions:        []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionFalse}},
		ContainerStatuses: []v1.ContainerStatus{{Started: new(true)}}}}
	starting := &v1.Pod{Status: v1.PodStatus{Phase: v1.PodRunning,
		ContainerStatuses: []v1.ContainerStatus{{Started: new(true)}, {Started: new(false)}}}}
	done := &v1.Pod{Status: v1.PodStatus{Phase: v1.PodSucceeded}}
	rejected := &v1.Pod{Status: v1.PodStatus{Phase: v1.PodFailed, Reason: "OutOfcpu", Message: "Pod was rejected: no cpu"}}
	waiting := &v1.Pod{Status: v1.PodStatus{Phase: v1.PodPending, Reason: reasonWaitingForDependencies, Message: "x-n1 not Ready"}}
	statuses := map[string]*v1.Pod{"default/ready": ready, "default/started": started, "default/starting": starting,
		"default/done": done, "default/rejected": rejected, "default/waiting": waiting, "default/new": nil, "other/ready": ready}
	lookup := func(key string) (*v1.Pod, bool) {
		st, ok := statuses[key]
		return st, ok
	}
	for value, want := range map[string]string{
		"ready, ready=Started, done=Completed, done=Started, other/ready, started=Started": "",
		"started":               "started not Ready (Running)",
		"starting=Started":      "starting not Started (Running)",
		"ready=Completed":       "ready not Completed (Running)",
		"rejected":              "rejected not Ready: OutOfcpu: Pod was rejected: no cpu",
		"waiting":               "waiting not Ready (it waits for x-n1 not Ready)",
		"new, gone, other/gone": "new not Ready, gone not found: no manifest defines it, other/gone not found: no manifest defines it",
	} {
		pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Annotations: map[string]string{manifests.WaitForAnnotation: value}}}
		if got := unmetDependencies(pod, lookup); got != want {
			t.Errorf("%q: %q, want %q", value, got, want)
		}
	}
}

// waitingPod is a pod that waits for what value names.
func waitingPod(uid, name, value string) *v1.Pod {
	p := testPod(uid, name, v1.RestartPolicyAlways)
	p.Annotations = map[string]string{manifests.WaitForAnnotation: value}
	return p
}

// probedPod is a pod with an exec readiness probe every second.
func probedPod(uid, name string) *v1.Pod {
	p := testPod(uid, name, v1.RestartPolicyAlways)
	p.Spec.Containers[0].ReadinessProbe = &v1.Probe{ProbeHandler: v1.ProbeHandler{Exec: &v1.ExecAction{Command: []string{"ready"}}},
		PeriodSeconds: 1, TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: 1}
	return p
}

func (f *engineFixture) setExit(code int) {
	f.rt.mu.Lock()
	f.rt.execResult = ExecResult{ExitCode: code}
	f.rt.mu.Unlock()
}

func (f *engineFixture) stoppedAny(uid string) bool {
	f.rt.mu.Lock()
	defer f.rt.mu.Unlock()
	return slices.ContainsFunc(f.rt.stopped, func(id string) bool { return id == ContainerID(uid, "main", 0) })
}

// B waits for A to be Ready: no sandbox, a WaitingForDependencies status and
// event; B starts once A's readiness probe passes, and A failing later does
// not touch B.
func TestEngineWaitForReady(t *testing.T) {
	f := startEngine(t)
	f.setExit(1)
	a, b := probedPod("a", "a"), waitingPod("b", "b", "a-n1")
	f.send(a, b)
	waitFor(t, "a started", func() bool { return f.rt.startedPod("a") })
	waitFor(t, "b waits for a Running", func() bool {
		s := f.status("b")
		return s != nil && s.Status.Message == "a-n1 not Ready (Running)"
	})
	s := f.status("b").Status
	if s.Phase != v1.PodPending || s.Reason != "WaitingForDependencies" || s.ContainerStatuses[0].State.Waiting.Reason != "WaitingForDependencies" {
		t.Errorf("b's status %+v, want Pending, WaitingForDependencies", s)
	}
	if !f.hasEvent("WaitingForDependencies", "a-n1 not Ready") || f.net.setupCount("b") != 0 || f.rt.startedPod("b") {
		t.Fatalf("b: events %+v, sandbox %d, started %t; want an event and nothing made", f.e.Events(), f.net.setupCount("b"), f.rt.startedPod("b"))
	}
	f.waitLoop(t)
	f.setExit(0)
	waitFor(t, "b started once a is Ready", func() bool {
		if !f.rt.startedPod("b") {
			f.clock.Advance(time.Second) // the next readiness probe of a
			return false
		}
		return true
	})
	if !dependencyHolds(f.status("a"), manifests.WaitReady) {
		t.Fatalf("b started while a is %+v", f.status("a").Status)
	}
	// a fails its probe and then exits: b keeps running.
	f.setExit(1)
	f.clock.Advance(time.Second)
	f.rt.exit(ContainerID("a", "main", 0), 1)
	waitFor(t, "a restarted", func() bool { return f.rt.startedCount() == 3 })
	if f.stoppedAny("b") || f.status("b").Status.Phase != v1.PodRunning {
		t.Fatalf("b after a failed: stopped %t, status %+v", f.stoppedAny("b"), f.status("b").Status)
	}
}

// B waits for A to complete; a dependency that is not defined (yet) keeps
// C waiting with a message naming it, until a manifest defines it.
func TestEngineWaitForCompletedAndUnknown(t *testing.T) {
	f := startEngine(t)
	job := testPod("job", "job", v1.RestartPolicyNever)
	b, c := waitingPod("b", "b", "job-n1=Completed"), waitingPod("c", "c", "later-n1=Started")
	f.send(job, b, c)
	waitFor(t, "job started", func() bool { return f.rt.startedPod("job") })
	waitFor(t, "c waits for an unknown pod", func() bool {
		s := f.status("c")
		return s != nil && s.Status.Message == "later-n1 not found: no manifest defines it"
	})
	f.rt.exit(ContainerID("job", "main", 0), 0)
	waitFor(t, "b started after the job", func() bool { return f.rt.startedPod("b") })
	if f.rt.startedPod("c") {
		t.Fatal("c started without its dependency")
	}
	f.send(job, b, c, testPod("later", "later", v1.RestartPolicyAlways))
	waitFor(t, "c started once later runs", func() bool { return f.rt.startedPod("c") })
}

// A noderun restart with both pods running adopts both, whether or not the
// dependency is Ready: a started pod is never held back.
func TestEngineWaitForRestartAdopts(t *testing.T) {
	a, b := probedPod("a", "a"), waitingPod("b", "b", "a-n1")
	running := func(p *v1.Pod) ContainerStatus {
		return ContainerStatus{ID: ContainerID(string(p.UID), "main", 0), PodUID: string(p.UID), PodName: p.Name, PodNamespace: "default",
			Name: "main", SpecHash: specHash(&p.Spec.Containers[0]), State: StateRunning, PID: 42}
	}
	f := startEngineWith(t, func(cfg *Config) {
		for _, uid := range []string{"a", "b"} {
			if err := os.MkdirAll(SandboxDir(cfg.RunDir, uid), 0o700); err != nil {
				t.Fatal(err)
			}
		}
	}, running(a), running(b))
	f.net.adopted = map[string]bool{"a": true, "b": true}
	f.setExit(1) // a is not Ready
	f.send(a, b)
	waitFor(t, "b adopted", func() bool {
		p := f.status("b")
		return p != nil && p.Status.Phase == v1.PodRunning
	})
	if n := f.rt.startedCount(); n != 0 || f.stoppedAny("b") || f.hasEvent("WaitingForDependencies", "") {
		t.Fatalf("restart: %d started, b stopped %t, events %+v; want both left alone", n, f.stoppedAny("b"), f.e.Events())
	}
}

// Pods of two sources that wait for each other are refused, each an error
// of its source; a source cannot see the cycle alone.
func TestEngineWaitForCycleAcrossSources(t *testing.T) {
	f := startEngine(t)
	f.snaps <- manifests.Snapshot{Source: "file:/one", Pods: []*v1.Pod{waitingPod("a", "a", "b-n1")},
		Info: manifests.SourceInfo{Pods: []manifests.PodInfo{{UID: "a", File: "/one/a.yaml", Line: 3}}}}
	f.snaps <- manifests.Snapshot{Source: "file:/two", Pods: []*v1.Pod{waitingPod("b", "b", "a-n1"), testPod("c", "c", v1.RestartPolicyAlways)}}
	waitFor(t, "c started", func() bool { return f.rt.startedPod("c") })
	errs := f.e.SourceErrors()
	cycle := "metadata.annotations[noderun.dev/wait-for]: wait-for cycle among default/a-n1, default/b-n1: none of them could ever start"
	if len(errs["file:/one"]) != 1 || errs["file:/one"][0].Error() != "/one/a.yaml:3: "+cycle ||
		len(errs["file:/two"]) != 1 || errs["file:/two"][0].Error() != "file:/two: "+cycle {
		t.Errorf("source errors %v", errs)
	}
	if f.status("a") != nil || f.status("b") != nil || f.rt.startedPod("a") || f.rt.startedPod("b") {
		t.Error("a pod of the cycle was run")
	}
}

// After a reboot (state dirs kept, sandbox dirs gone) pods wait again: the
// one with state is held, not taken for an orphan and started.
func TestEngineWaitForAfterReboot(t *testing.T) {
	a, b := probedPod("a", "a"), waitingPod("b", "b", "a-n1")
	f := startEngineWith(t, func(cfg *Config) {
		if err := os.MkdirAll(podStateDir(cfg.StateDir, "b"), 0o700); err != nil {
			t.Fatal(err)
		}
	})
	f.setExit(1)
	f.send(a, b)
	waitFor(t, "a started", func() bool { return f.rt.startedPod("a") })
	waitFor(t, "b held", func() bool {
		s := f.status("b")
		return s != nil && s.Status.Reason == reasonWaitingForDependencies
	})
	f.waitLoop(t) // settled: orphans were looked for
	if f.rt.startedPod("b") || f.net.setupCount("b") != 0 {
		t.Fatal("b started after a reboot before a is Ready")
	}
	f.setExit(0)
	waitFor(t, "b started once a is Ready", func() bool {
		if !f.rt.startedPod("b") {
			f.clock.Advance(time.Second)
			return false
		}
		return true
	})
}
