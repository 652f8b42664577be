package runner

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// versionPod is pod "web" at version uid running image.
func versionPod(uid, image string) *v1.Pod {
	p := testPod(uid, "web", v1.RestartPolicyAlways)
	p.Spec.Containers[0].Image = image
	return p
}

func (f *engineFixture) ensureCount() int {
	f.rt.mu.Lock()
	defer f.rt.mu.Unlock()
	return f.rt.ensures
}

func (f *engineFixture) gatePull(image string) chan struct{} {
	gate := make(chan struct{})
	f.rt.mu.Lock()
	f.rt.imagePulls = true
	f.rt.pullGate = map[string]chan struct{}{image: gate}
	f.rt.mu.Unlock()
	return gate
}

// A new version with a new image pulls it while the old one runs and is
// listed alone; the old one stops only once the pull is done, and the new
// one's start pulls no more.
func TestEngineUpdatePullsBeforeReplacing(t *testing.T) {
	f := startEngine(t)
	f.send(versionPod("v1", "app:1"))
	waitFor(t, "v1 start", func() bool { return f.rt.startedPod("v1") })
	gate := f.gatePull("app:2")
	f.send(versionPod("v2", "app:2"))
	waitFor(t, "the pull ahead", func() bool {
		return f.hasPodEvent2("v1", reasonUpdatePulling, `Pulling image "app:2" for the pod's new version (uid v2)`)
	})
	f.waitLoop(t)
	if f.stoppedAny("v1") || f.rt.startedPod("v2") || f.status("v2") != nil || f.status("v1").Status.Phase != v1.PodRunning {
		t.Fatalf("during the pull: v1 stopped %t, v2 started %t, v2 listed %t", f.stoppedAny("v1"), f.rt.startedPod("v2"), f.status("v2") != nil)
	}
	ensures := f.ensureCount()
	close(gate)
	waitFor(t, "v2 start", func() bool { return f.rt.startedPod("v2") })
	if !f.stoppedAny("v1") || !f.hasPodEvent2("v1", reasonUpdatePulled, `Successfully pulled image "app:2"`) {
		t.Fatalf("v2 started: v1 stopped %t, events %+v", f.stoppedAny("v1"), f.e.Events())
	}
	if got := f.ensureCount(); got != ensures {
		t.Errorf("the new version's start checked its image %d more times; want it to use the pull ahead", got-ensures)
	}
	waitFor(t, "v1 gone", func() bool { return f.status("v1") == nil })
}

// hasPodEvent2 reports an event of pod uid with reason whose message
// contains substr.
func (f *engineFixture) hasPodEvent2(uid, reason, substr string) bool {
	for _, ev := range f.e.Events() {
		if string(ev.InvolvedObject.UID) == uid && ev.Reason == reason && strings.Contains(ev.Message, substr) {
			return true
		}
	}
	return false
}

// A pull that fails keeps the old version running, says why in a Warning
// on it, and is retried after the kubelet's image backoff: 10 s, 20 s.
func TestEngineUpdatePullFailureKeepsOldVersion(t *testing.T) {
	f := startEngine(t)
	f.send(versionPod("v1", "app:1"))
	waitFor(t, "v1 start", func() bool { return f.rt.startedPod("v1") })
	f.rt.mu.Lock()
	f.rt.imageErrOf = map[string]error{"app:2": errors.New("connection refused")}
	f.rt.mu.Unlock()
	f.send(versionPod("v2", "app:2"))
	msg := `Failed to pull image "app:2" for the pod's new version (uid v2): connection refused; this version keeps running, next try in `
	waitFor(t, "the first failure", func() bool { return f.hasPodEvent2("v1", reasonUpdatePullFailed, msg+"10s") })
	waitFor(t, "the retry's timer", func() bool { return f.clock.timerIn(10 * time.Second) })
	f.clock.Advance(10 * time.Second)
	waitFor(t, "the second failure", func() bool { return f.hasPodEvent2("v1", reasonUpdatePullFailed, msg+"20s") })
	if f.stoppedAny("v1") || f.rt.startedPod("v2") {
		t.Fatal("the old version stopped though the new image could not be had")
	}
	f.rt.mu.Lock()
	f.rt.imageErrOf = nil
	f.rt.mu.Unlock()
	waitFor(t, "the next retry's timer", func() bool { return f.clock.timerIn(20 * time.Second) })
	f.clock.Advance(20 * time.Second)
	waitFor(t, "v2 start", func() bool { return f.rt.startedPod("v2") })
}

// An edit that keeps the images replaces the pod at once: no pull ahead.
func TestEngineUpdateWithSameImagesReplacesAtOnce(t *testing.T) {
	f := startEngine(t)
	f.send(versionPod("v1", "app:1"))
	waitFor(t, "v1 start", func() bool { return f.rt.startedPod("v1") })
	f.gatePull("app:1") // would hang a pull ahead
	v2 := versionPod("v2", "app:1")
	v2.Spec.Containers[0].Args = []string{"other"}
	v2.Spec.Containers[0].ImagePullPolicy = v1.PullIfNotPresent
	f.rt.mu.Lock()
	f.rt.imagePulls = false
	f.rt.pullGate = nil
	f.rt.mu.Unlock()
	f.send(v2)
	waitFor(t, "v2 start", func() bool { return f.rt.startedPod("v2") })
	if f.hasEvent(reasonUpdatePulling, "") {
		t.Error("an edit that keeps the images pulled ahead")
	}
}

// A noderun restart during the pull: the old version, known from its
// saved spec only, is adopted and keeps running; the pull starts over, and
// the old version goes once it is done.
func TestEngineUpdateRestartDuringPull(t *testing.T) {
	old := versionPod("v1", "app:1")
	f := startEngineWith(t, func(cfg *Config) {
		if err := os.MkdirAll(SandboxDir(cfg.RunDir, "v1"), 0o700); err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(old)
		if err := os.MkdirAll(podStateDir(cfg.StateDir, "v1"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(podStateDir(cfg.StateDir, "v1"), "pod.json"), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}, ContainerStatus{ID: ContainerID("v1", "main", 0), PodUID: "v1", PodName: old.Name, PodNamespace: "default",
		Name: "main", SpecHash: specHash(&old.Spec.Containers[0]), State: StateRunning, PID: 42})
	f.net.adopted = map[string]bool{"v1": true}
	gate := f.gatePull("app:2")
	f.send(versionPod("v2", "app:2"))
	waitFor(t, "the pull ahead", func() bool { return f.hasPodEvent2("v1", reasonUpdatePulling, "uid v2") })
	waitFor(t, "v1 adopted", func() bool { p := f.status("v1"); return p != nil && p.Status.Phase == v1.PodRunning })
	f.waitLoop(t) // settled: orphans were looked for
	if f.stoppedAny("v1") || f.rt.startedCount() != 0 {
		t.Fatalf("during the pull after a restart: v1 stopped %t, %d started", f.stoppedAny("v1"), f.rt.startedCount())
	}
	close(gate)
	waitFor(t, "v2 start", func() bool { return f.rt.startedPod("v2") })
	if !f.stoppedAny("v1") {
		t.Fatal("v2 started beside v1")
	}
}

// A newer edit during the pull drops the version being pulled (its pull
// ends with its worker) and pulls the newer one's images, the old version
// running on until then.
func TestEngineUpdateSupersededDuringPull(t *testing.T) {
	f := startEngine(t)
	f.send(versionPod("v1", "app:1"))
	waitFor(t, "v1 start", func() bool { return f.rt.startedPod("v1") })
	f.gatePull("app:2")
	f.send(versionPod("v2", "app:2"))
	waitFor(t, "v2's pull ahead", func() bool { return f.hasPodEvent2("v1", reasonUpdatePulling, "uid v2") })
	f.send(versionPod("v3", "app:3"))
	waitFor(t, "v3 start", func() bool { return f.rt.startedPod("v3") })
	if f.rt.startedPod("v2") || !f.stoppedAny("v1") || !f.hasPodEvent2("v1", reasonUpdatePulled, `"app:3"`) {
		t.Fatalf("v2 started %t, v1 stopped %t; events %+v", f.rt.startedPod("v2"), f.stoppedAny("v1"), f.e.Events())
	}
	waitFor(t, "v2's worker gone", func() bool {
		f.e.mu.Lock()
		defer f.e.mu.Unlock()
		return f.e.workers["v2"] == nil
	})
}
