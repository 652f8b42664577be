package runner

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/manifests"
)

// rolloutPod is version uid of pod "web": image, a readiness probe, and
// the rollback annotation when after is set.
func rolloutPod(uid, image, after string) *v1.Pod {
	p := probedPod(uid, "web")
	p.Spec.Containers[0].Image = image
	if after != "" {
		p.Annotations = map[string]string{manifests.RollbackAfterAnnotation: after}
	}
	return p
}

func (f *engineFixture) startsOf(uid string) int {
	f.rt.mu.Lock()
	defer f.rt.mu.Unlock()
	n := 0
	for _, c := range f.rt.started {
		if string(c.Pod.UID) == uid {
			n++
		}
	}
	return n
}

func rolledBackCondition(p *v1.Pod) *v1.PodCondition {
	if p == nil {
		return nil
	}
	i := slices.IndexFunc(p.Status.Conditions, func(c v1.PodCondition) bool { return c.Type == ConditionRolledBack })
	if i < 0 {
		return nil
	}
	return &p.Status.Conditions[i]
}

// waitReady advances the clock a second at a time (the probe's period)
// until pod uid is Ready.
func (f *engineFixture) waitReady(t *testing.T, uid string) {
	t.Helper()
	waitFor(t, uid+" Ready", func() bool {
		if p := f.status(uid); p != nil && podReady(&p.Status) {
			return true
		}
		f.clock.Advance(time.Second)
		return false
	})
}

// A version not Ready within its deadline of its start (and not before)
// is replaced by the last Ready one, with a RolledBack warning and
// condition; it is not run again until the manifest changes.
func TestEngineRollsBackAVersionNotReadyInTime(t *testing.T) {
	f := startEngine(t)
	f.send(rolloutPod("v1", "app:1", ""))
	f.waitLoop(t)
	f.waitReady(t, "v1")
	waitFor(t, "v1 kept as the last Ready version", func() bool { r := f.e.rolloutOf("default/web-n1"); return r != nil && r.Ready.UID == "v1" })

	f.setExit(1) // v2 never gets Ready
	f.send(rolloutPod("v2", "app:2", "2m"))
	waitFor(t, "v2 start", func() bool { return f.rt.startedPod("v2") })
	waitFor(t, "the deadline's timer", func() bool { return f.clock.timerIn(2 * time.Minute) })
	f.clock.Advance(2*time.Minute - time.Second)
	waitFor(t, "the deadline's timer, a second left", func() bool { return f.clock.timerIn(time.Second) })
	if f.hasEvent(reasonRolledBack, "") || f.stoppedAny("v2") {
		t.Fatal("rolled back before the deadline")
	}
	f.clock.Advance(time.Second)
	waitFor(t, "v1 back", func() bool { return f.startsOf("v1") == 2 })
	if !f.stoppedAny("v2") {
		t.Fatal("v1 started beside v2")
	}
	want := "Version v2 was not Ready within 2m0s of its start (ContainersNotReady: containers with unready status: [main]); rolled back to version v1"
	if !f.hasPodEvent2("v1", reasonRolledBack, want) {
		t.Fatalf("no RolledBack event on v1 saying %q: %+v", want, f.e.Events())
	}
	f.setExit(0)
	f.waitReady(t, "v1")
	if c := rolledBackCondition(f.status("v1")); c == nil || c.Status != v1.ConditionTrue || c.Reason != "ContainersNotReady" || !strings.Contains(c.Message, want) {
		t.Fatalf("v1's RolledBack condition: %+v", c)
	}
	if f.status("v2") != nil {
		waitFor(t, "v2 gone", func() bool { return f.status("v2") == nil })
	}

	// The same manifest again: the failed version stays off.
	again := rolloutPod("v2", "app:2", "2m")
	f.send(again)
	f.send(again) // taken once the first is applied
	f.e.mu.Lock()
	w := f.e.workers["v2"]
	f.e.mu.Unlock()
	if n := f.startsOf("v2"); n != 1 || w != nil || f.startsOf("v1") != 2 || !podReady(&f.status("v1").Status) {
		t.Fatalf("the failed version ran again (%d starts, worker %t), or v1 changed: %d starts, %+v", n, w != nil, f.startsOf("v1"), f.status("v1").Status)
	}
	// A changed manifest runs.
	f.send(rolloutPod("v3", "app:3", "2m"))
	waitFor(t, "v3 start", func() bool { return f.rt.startedPod("v3") })
	if r := f.e.rolloutOf("default/web-n1"); r.Failed != nil {
		t.Errorf("the rollback outlived the manifest change: %+v", r.Failed)
	}
}

// After a noderun restart the rollback holds: the version rolled back to
// runs, the failed one does not.
func TestEngineRollbackSurvivesRestart(t *testing.T) {
	good := rolloutPod("v1", "app:1", "")
	f := startEngineWith(t, func(cfg *Config) {
		r := rollout{Ready: good, Failed: &failedVersion{UID: "v2", Reason: "CrashLoopBackOff", Message: "Version v2 was not Ready"}}
		b, _ := json.Marshal(r)
		if err := os.MkdirAll(rolloutDir(cfg.StateDir), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(rolloutPath(cfg.StateDir, "default/web-n1"), b, 0o600); err != nil {
			t.Fatal(err)
		}
	})
	f.send(rolloutPod("v2", "app:2", "1m"))
	waitFor(t, "v1 start", func() bool { return f.rt.startedPod("v1") })
	f.waitLoop(t)
	if f.rt.startedPod("v2") {
		t.Fatal("the failed version ran after a restart")
	}
	if c := rolledBackCondition(f.status("v1")); c == nil || c.Reason != "CrashLoopBackOff" {
		t.Fatalf("v1's RolledBack condition: %+v", c)
	}
}

// Without an earlier Ready version there is nothing to roll back to: the
// version keeps running, and a warning says so once.
func TestEngineRollbackWithoutAReadyVersion(t *testing.T) {
	f := startEngine(t)
	f.setExit(1)
	f.send(rolloutPod("v1", "app:1", "1m"))
	waitFor(t, "v1 start", func() bool { return f.rt.startedPod("v1") })
	waitFor(t, "the deadline's timer", func() bool { return f.clock.timerIn(time.Minute) })
	f.clock.Advance(time.Minute)
	waitFor(t, "the warning", func() bool {
		return f.hasEvent(reasonRollbackUnavailable, "no earlier version of the pod was ever Ready")
	})
	if f.stoppedAny("v1") {
		t.Fatal("v1 stopped")
	}
}

func TestNotReady(t *testing.T) {
	s := &v1.PodStatus{
		InitContainerStatuses: []v1.ContainerStatus{{Name: "init", State: v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: 0}}}},
		ContainerStatuses: []v1.ContainerStatus{
			{Name: "ok", Ready: true},
			{Name: "probe", State: v1.ContainerState{Running: &v1.ContainerStateRunning{}}},
			{Name: "crash", State: v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 10s"}}},
		},
	}
	reason, msg := notReady(s)
	if want := "containers with unready status: [probe crash]; crash: CrashLoopBackOff: back-off 10s"; reason != "CrashLoopBackOff" || msg != want {
		t.Errorf("notReady = %q, %q; want CrashLoopBackOff, %q", reason, msg, want)
	}
}
