package runner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/noderun/noderun/manifests"
	"github.com/noderun/noderun/runner/volume"
)

type engineFixture struct {
	e     *Engine
	rt    *fakeRuntime
	net   *fakeNetwork
	clock *fakeClock
	snaps chan manifests.Snapshot
}

func startEngine(t *testing.T, preload ...ContainerStatus) *engineFixture {
	t.Helper()
	return startEngineWith(t, func(*Config) {}, preload...)
}

// startEngineWith is startEngine with the config changed by set; whatever
// the engine mounted in its dirs is unmounted at the test's end.
func startEngineWith(t *testing.T, set func(*Config), preload ...ContainerStatus) *engineFixture {
	t.Helper()
	clock := newFakeClock()
	f := &engineFixture{rt: newFakeRuntime(clock), net: &fakeNetwork{}, clock: clock, snaps: make(chan manifests.Snapshot)}
	for i := range preload {
		f.rt.containers[preload[i].ID] = &preload[i]
	}
	dir := t.TempDir()
	t.Cleanup(func() { _ = volume.UnmountAll(dir) })
	cfg := Config{
		NodeName: "n1", HostIP: "192.0.2.1", StateDir: filepath.Join(dir, "state"), RunDir: filepath.Join(dir, "run"),
		PodLogDir: filepath.Join(dir, "logs"), ResolvConf: filepath.Join(dir, "missing-resolv.conf"), Clock: clock,
		NetworkCheck: 5 * time.Minute,
	}
	set(&cfg)
	f.e = New(cfg, f.rt, f.net)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.e.Run(ctx, f.snaps, 1) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return f
}

// waitLoop waits for the engine's loop to arm its resync ticker. The loop
// gets there after the first snapshot's pods may have started: advancing
// the fake clock before would pass the ticker by, and no resync would come.
func (f *engineFixture) waitLoop(t *testing.T) {
	t.Helper()
	waitFor(t, "the engine's resync ticker", func() bool { return f.clock.timerIn(f.e.cfg.Resync) })
}

func (f *engineFixture) send(pods ...*v1.Pod) {
	f.snaps <- manifests.Snapshot{Source: "file:/test", Pods: pods}
}

func testPod(uid, name string, policy v1.RestartPolicy) *v1.Pod {
	grace := int64(30)
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-n1", Namespace: "default", UID: types.UID(uid)},
		Spec: v1.PodSpec{
			RestartPolicy: policy, TerminationGracePeriodSeconds: &grace, DNSPolicy: v1.DNSDefault,
			Containers: []v1.Container{{Name: "main", Image: "busybox:1.36", Args: []string{"run", "$(X)"},
				Env: []v1.EnvVar{{Name: "X", Value: "x-value"}}}},
		},
	}
}

// waitLimit only tells a hang from slowness: with a fake clock nothing here
// waits on time, but on a busy machine (or under qemu) what takes
// milliseconds may take seconds.
const waitLimit = time.Minute

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func (f *engineFixture) status(uid string) *v1.Pod {
	for _, p := range f.e.Pods() {
		if string(p.UID) == uid {
			return &p
		}
	}
	return nil
}

func TestEngineRestartsWithCrashBackoff(t *testing.T) {
	f := startEngine(t)
	f.send(testPod("u1", "web", v1.RestartPolicyAlways))
	waitFor(t, "first start", func() bool { return f.rt.startedCount() == 1 })

	first := f.rt.started[0]
	if want := []string{"/entry", "run", "x-value"}; !slices.Equal(first.Args, want) {
		t.Fatalf("args = %q, want %q (image entrypoint + expanded args)", first.Args, want)
	}
	f.rt.exit(first.ID, 3)
	// First crash: restarted at once, like the kubelet.
	waitFor(t, "immediate restart", func() bool { return f.rt.startedCount() == 2 })
	second := f.rt.started[1]
	if second.RestartCount != 1 || second.LastState == nil || second.LastState.ExitCode != 3 {
		t.Fatalf("restart = %d, lastState = %+v; want 1 and exit code 3", second.RestartCount, second.LastState)
	}
	f.rt.exit(second.ID, 3)
	waitFor(t, "CrashLoopBackOff", func() bool {
		p := f.status("u1")
		return p != nil && p.Status.ContainerStatuses[0].State.Waiting != nil &&
			p.Status.ContainerStatuses[0].State.Waiting.Reason == "CrashLoopBackOff"
	})
	// The status can show the backoff before the worker arms its timer;
	// advancing the fake clock first would arm it 10s past the new now.
	waitFor(t, "a 10s backoff armed", func() bool { return f.clock.timerIn(10 * time.Second) })
	f.clock.Advance(9 * time.Second)
	time.Sleep(20 * time.Millisecond)
	if n := f.rt.startedCount(); n != 2 {
		t.Fatalf("restarted after 9s; the second crash must wait 10s (starts=%d)", n)
	}
	f.clock.Advance(time.Second)
	waitFor(t, "restart after 10s backoff", func() bool { return f.rt.startedCount() == 3 })
	p := f.status("u1")
	waitFor(t, "status restartCount 2", func() bool {
		p = f.status("u1")
		return p.Status.ContainerStatuses[0].RestartCount == 2 && p.Status.ContainerStatuses[0].State.Running != nil
	})
	if p.Status.Phase != v1.PodRunning || p.Status.PodIP != "10.0.0.2" {
		t.Fatalf("phase %s ip %q; want Running on 10.0.0.2", p.Status.Phase, p.Status.PodIP)
	}
	if len(f.rt.containers) != 1 {
		t.Fatalf("%d containers left; replaced ones must be removed", len(f.rt.containers))
	}
}

func TestEngineRestartPolicyNeverEndsInPhase(t *testing.T) {
	for _, tc := range []struct {
		code int
		want v1.PodPhase
	}{{0, v1.PodSucceeded}, {7, v1.PodFailed}} {
		f := startEngine(t)
		f.send(testPod("u1", "job", v1.RestartPolicyNever))
		waitFor(t, "start", func() bool { return f.rt.startedCount() == 1 })
		f.rt.exit(f.rt.started[0].ID, tc.code)
		waitFor(t, string(tc.want), func() bool { p := f.status("u1"); return p != nil && p.Status.Phase == tc.want })
		term := f.status("u1").Status.ContainerStatuses[0].State.Terminated
		if term == nil || int(term.ExitCode) != tc.code {
			t.Fatalf("terminated = %+v, want exit code %d", term, tc.code)
		}
		if f.rt.startedCount() != 1 {
			t.Fatalf("restartPolicy Never restarted the container")
		}
	}
}

func TestEngineAdoptsRunningAndRemovesOrphans(t *testing.T) {
	pod := testPod("keep", "web", v1.RestartPolicyAlways)
	running := ContainerStatus{
		ID: ContainerID("keep", "main", 4), PodUID: "keep", PodName: pod.Name, PodNamespace: "default",
		Name: "main", SpecHash: specHash(&pod.Spec.Containers[0]), RestartCount: 4, State: StateRunning, PID: 42,
	}
	orphan := ContainerStatus{ID: ContainerID("gone", "main", 0), PodUID: "gone", PodName: "old-n1",
		PodNamespace: "default", Name: "main", State: StateRunning}
	f := startEngine(t, running, orphan)
	f.net.adopted = map[string]bool{"keep": true} // its sandbox survived the restart
	f.send(pod)
	waitFor(t, "orphan teardown", func() bool { return slices.Contains(f.net.tornDown(), "gone") })
	waitFor(t, "adopted status", func() bool {
		p := f.status("keep")
		return p != nil && p.Status.Phase == v1.PodRunning
	})
	if n := f.rt.startedCount(); n != 0 {
		t.Fatalf("adoption started %d containers; a running pod must be left alone", n)
	}
	if got := f.status("keep").Status.ContainerStatuses[0].RestartCount; got != 4 {
		t.Fatalf("restartCount %d, want 4 from the container's labels", got)
	}
	f.rt.mu.Lock()
	defer f.rt.mu.Unlock()
	if _, ok := f.rt.containers[orphan.ID]; ok || !slices.Contains(f.rt.stopped, orphan.ID) {
		t.Fatalf("orphan not stopped and removed (stopped=%v)", f.rt.stopped)
	}
	waitFor(t, "network GC at start", func() bool { return f.net.lastGCKeep() != nil })
	if keep := f.net.lastGCKeep(); !keep[SandboxID("keep")] {
		t.Fatalf("network GC at start must keep the adopted pod's sandbox: keep=%v", keep)
	}
}

// TestEngineNetworkGCOffLoop blocks the network GC: the loop goes on (a new
// snapshot is taken, the kept pod runs), while the worker of a pod that
// came after the GC began waits for it before touching the network.
func TestEngineNetworkGCOffLoop(t *testing.T) {
	f := startEngine(t)
	block := make(chan struct{})
	f.net.mu.Lock()
	f.net.gcBlock = block
	f.net.mu.Unlock()
	a, b := testPod("a", "a", v1.RestartPolicyAlways), testPod("b", "b", v1.RestartPolicyAlways)
	f.send(a)
	waitFor(t, "network GC at start", func() bool { return f.net.lastGCKeep() != nil })
	select {
	case f.snaps <- manifests.Snapshot{Source: "file:/test", Pods: []*v1.Pod{a, b}}:
	case <-time.After(2 * time.Second):
		close(block)
		t.Fatal("the main loop takes no snapshot while the network GC runs")
	}
	waitFor(t, "pod a running during GC", func() bool {
		p := f.status("a")
		return p != nil && p.Status.Phase == v1.PodRunning
	})
	time.Sleep(20 * time.Millisecond)
	if n := f.net.setupCount("b"); n != 0 {
		t.Fatalf("pod b set up %d times while a GC that may release its sandbox ID ran", n)
	}
	close(block)
	waitFor(t, "pod b set up after GC", func() bool { return f.net.setupCount("b") == 1 })
}

func TestEngineKeepsPodsOfAnUnavailableSourceUntilItAnswers(t *testing.T) {
	pod := testPod("url-pod", "web", v1.RestartPolicyAlways)
	running := ContainerStatus{
		ID: ContainerID("url-pod", "main", 0), PodUID: "url-pod", PodName: pod.Name, PodNamespace: "default",
		Name: "main", SpecHash: specHash(&pod.Spec.Containers[0]), State: StateRunning,
	}
	orphan := ContainerStatus{ID: ContainerID("gone", "main", 0), PodUID: "gone", PodName: "old-n1",
		PodNamespace: "default", Name: "main", State: StateRunning}
	f := startEngine(t, running, orphan)
	f.net.adopted = map[string]bool{"url-pod": true}
	f.snaps <- manifests.Snapshot{Source: "url:http://config/pods", Unavailable: true}
	waitFor(t, "ready", func() bool { return f.e.ready.Load() })
	time.Sleep(20 * time.Millisecond)
	f.rt.mu.Lock()
	stopped := len(f.rt.stopped)
	f.rt.mu.Unlock()
	if stopped != 0 || f.net.gcKeep != nil {
		t.Fatalf("with a source that never answered: %d stops, GC keep %v; want nothing removed", stopped, f.net.gcKeep)
	}
	f.snaps <- manifests.Snapshot{Source: "url:http://config/pods", Pods: []*v1.Pod{pod}}
	waitFor(t, "orphan removed", func() bool { return slices.Contains(f.net.tornDown(), "gone") })
	waitFor(t, "adopted", func() bool { p := f.status("url-pod"); return p != nil && p.Status.Phase == v1.PodRunning })
	f.rt.mu.Lock()
	defer f.rt.mu.Unlock()
	if slices.Contains(f.rt.stopped, running.ID) || len(f.rt.started) != 0 {
		t.Fatalf("the URL pod was restarted (stopped %v, started %d); it must be adopted", f.rt.stopped, len(f.rt.started))
	}
}

func TestEngineRecreatesBrokenSandbox(t *testing.T) {
	f := startEngine(t)
	f.send(testPod("u1", "web", v1.RestartPolicyAlways))
	waitFor(t, "start", func() bool { return f.rt.startedCount() == 1 })
	f.net.breakSandbox("u1")
	f.e.NetworkChanged(SandboxID("u1"))
	waitFor(t, "restart in a new sandbox", func() bool { return f.rt.startedCount() == 2 })
	f.rt.mu.Lock()
	stopped := slices.Contains(f.rt.stopped, f.rt.started[0].ID)
	rc := f.rt.started[1].RestartCount
	f.rt.mu.Unlock()
	if !stopped || rc != 1 {
		t.Fatalf("old container stopped=%v, new restartCount=%d; want the container stopped and restarted", stopped, rc)
	}
	if n := len(f.net.tornDown()); n != 1 {
		t.Fatalf("%d teardowns, want the broken sandbox torn down once", n)
	}
}

// TestEngineNetworkGCBounded has the network GC hang: a pod that came after
// it began waits only until the GC's bound.
func TestEngineNetworkGCBounded(t *testing.T) {
	f := startEngine(t)
	f.e.netGCTimeout = 100 * time.Millisecond // read by Run only after the send below
	f.net.mu.Lock()
	f.net.gcBlock = make(chan struct{}) // never closed
	f.net.mu.Unlock()
	a, b := testPod("a", "a", v1.RestartPolicyAlways), testPod("b", "b", v1.RestartPolicyAlways)
	f.send(a)
	waitFor(t, "network GC at start", func() bool { return f.net.lastGCKeep() != nil })
	f.send(a, b)
	waitFor(t, "pod b set up once the GC gave up", func() bool { return f.net.setupCount("b") == 1 })
}

// TestEngineKeepsSandboxOnCheckError has every deep check fail without
// the sandbox being broken: the pod keeps running in its sandbox, and the
// failure shows as one Warning event with a count.
func TestEngineKeepsSandboxOnCheckError(t *testing.T) {
	f := startEngine(t)
	f.net.mu.Lock()
	f.net.checkErr = errors.New("cni: check: firewall backend unavailable")
	f.net.mu.Unlock()
	f.send(testPod("u1", "web", v1.RestartPolicyAlways))
	waitFor(t, "start", func() bool { return f.rt.startedCount() == 1 })
	f.waitLoop(t)
	var ev *v1.Event
	for i := range 2 { // two deep checks, 5m apart
		f.clock.Advance(5 * time.Minute)
		waitFor(t, "the check failure's event", func() bool {
			ev = nil
			for _, e := range f.e.events.list() {
				if e.Reason == reasonNetworkCheckFailed {
					ev = &e
				}
			}
			return ev != nil && ev.Count == int32(i+1)
		})
	}
	if ev.Type != v1.EventTypeWarning || !strings.Contains(ev.Message, "firewall backend unavailable") {
		t.Errorf("event %s %q, want a Warning naming the error", ev.Type, ev.Message)
	}
	if n, torn := f.rt.startedCount(), f.net.tornDown(); n != 1 || len(torn) != 0 {
		t.Fatalf("%d starts, teardowns %v; want the pod kept in its sandbox", n, torn)
	}
}

func TestEngineChecksNetworkDeeplyOnlyEveryInterval(t *testing.T) {
	f := startEngine(t)
	f.send(testPod("u1", "web", v1.RestartPolicyAlways))
	waitFor(t, "start", func() bool { return f.rt.startedCount() == 1 })
	f.waitLoop(t)
	deep := func() int { f.net.mu.Lock(); defer f.net.mu.Unlock(); return f.net.deepChecks }
	for range 4 { // resyncs within the interval: cheap checks only
		f.clock.Advance(time.Minute)
		time.Sleep(10 * time.Millisecond)
	}
	if n := deep(); n != 0 {
		t.Fatalf("%d deep checks within the 5m interval, want 0", n)
	}
	f.clock.Advance(time.Minute)
	waitFor(t, "a deep check after 5m", func() bool { return deep() == 1 })
}

func TestEngineNetworkNotReadyKeepsHostNetworkPodsRunning(t *testing.T) {
	f := startEngine(t)
	f.net.setupErr = fmt.Errorf("%w: no CNI config in /etc/cni/net.d", ErrNetworkNotReady)
	host := testPod("h", "etcd", v1.RestartPolicyAlways)
	host.Spec.HostNetwork = true
	f.send(testPod("p", "web", v1.RestartPolicyAlways), host)
	waitFor(t, "hostNetwork pod started", func() bool { return f.rt.startedCount() == 1 })
	waitFor(t, "NetworkNotReady reason", func() bool {
		p := f.status("p")
		if p == nil {
			return false
		}
		for _, c := range p.Status.Conditions {
			if c.Type == v1.PodReadyToStartContainers && c.Status == v1.ConditionFalse && c.Reason == "NetworkNotReady" &&
				strings.Contains(c.Message, "no CNI config") {
				return true
			}
		}
		return false
	})
	if got := f.rt.started[0].Pod.UID; got != "h" {
		t.Fatalf("started pod %s, want only the hostNetwork pod", got)
	}
}

func TestEngineReplacesPodOfSameNameAfterOldOneIsGone(t *testing.T) {
	f := startEngine(t)
	f.send(testPod("v1", "web", v1.RestartPolicyAlways))
	waitFor(t, "v1 start", func() bool { return f.rt.startedCount() == 1 })
	f.send(testPod("v2", "web", v1.RestartPolicyAlways))
	waitFor(t, "v2 start", func() bool { return f.rt.startedCount() == 2 })
	if !slices.Contains(f.net.tornDown(), "v1") {
		t.Fatal("new version started before the old one was torn down")
	}
	waitFor(t, "v1 status gone", func() bool { return f.status("v1") == nil })
}

// A pod's removal wakes only a pod of the same name, which may wait for it:
// waking all made each removal resync every other pod.
func TestEngineRemovalLeavesOtherPodsAlone(t *testing.T) {
	f := startEngine(t)
	a, b := testPod("a", "keep", v1.RestartPolicyAlways), testPod("b", "gone", v1.RestartPolicyAlways)
	f.send(a, b)
	waitFor(t, "both started", func() bool { return f.rt.startedCount() == 2 })
	listsOfA := func() int { f.rt.mu.Lock(); defer f.rt.mu.Unlock(); return f.rt.listsOf["a"] }
	before := listsOfA()
	f.send(a)
	waitFor(t, "b gone", func() bool { return f.status("b") == nil })
	time.Sleep(50 * time.Millisecond) // real time, for a sync a poke would have started
	if got := listsOfA(); got != before {
		t.Fatalf("pod a listed %d times while b was removed; want none", got-before)
	}
}

func TestEngineListsTerminatingPodUntilGone(t *testing.T) {
	f := startEngine(t)
	f.rt.stopGate = make(chan struct{})
	f.send(testPod("u1", "web", v1.RestartPolicyAlways))
	waitFor(t, "start", func() bool { return f.rt.startedCount() == 1 })
	f.send()
	waitFor(t, "deletionTimestamp", func() bool { p := f.status("u1"); return p != nil && p.DeletionTimestamp != nil })
	close(f.rt.stopGate)
	waitFor(t, "pod gone", func() bool { return f.status("u1") == nil })
}

func TestEngineBacksOffWhenTheExitStreamKeepsBreaking(t *testing.T) {
	f := startEngine(t)
	f.rt.mu.Lock()
	f.rt.exitsBroken = true
	f.rt.mu.Unlock()
	f.send()
	calls := func() int { f.rt.mu.Lock(); defer f.rt.mu.Unlock(); return f.rt.exitsCalls }
	waitFor(t, "ready", func() bool { return f.e.ready.Load() })
	time.Sleep(50 * time.Millisecond) // real time: a busy loop would call thousands of times
	if n := calls(); n != 1 {
		t.Fatalf("Exits called %d times without the clock moving; want 1 (a backoff, not a loop)", n)
	}
	for want, step := range []time.Duration{100, 200, 400} {
		waitFor(t, fmt.Sprintf("a %dms backoff armed", step), func() bool { return f.clock.timerIn(step * time.Millisecond) })
		f.clock.Advance(step * time.Millisecond)
		waitFor(t, fmt.Sprintf("resubscription %d", want+2), func() bool { return calls() == want+2 })
	}
	waitFor(t, "an 800ms backoff armed", func() bool { return f.clock.timerIn(800 * time.Millisecond) })
	f.clock.Advance(399 * time.Millisecond)
	time.Sleep(20 * time.Millisecond)
	if n := calls(); n != 4 {
		t.Fatalf("resubscribed after 399ms of an 800ms backoff (%d calls)", n)
	}
}

func TestBackoffSequence(t *testing.T) {
	var b backoff
	start := time.Now()
	var got []time.Duration
	for i := range 8 {
		got = append(got, b.waitFor(string(rune('a'+i)), start, start.Add(time.Duration(i)*time.Second)))
	}
	want := []time.Duration{0, 10 * time.Second, 20 * time.Second, 40 * time.Second, 80 * time.Second,
		160 * time.Second, 300 * time.Second, 300 * time.Second}
	if !slices.Equal(got, want) {
		t.Fatalf("backoff %v, want %v", got, want)
	}
	if again := b.waitFor("h", start, start); again != 300*time.Second {
		t.Fatalf("same container asked twice got %v, want the same wait", again)
	}
	if reset := b.waitFor("long-runner", start, start.Add(11*time.Minute)); reset != 0 {
		t.Fatalf("a crash 11m after the previous one should restart at once, got %v", reset)
	}
}

// A finish time from before a backwards step of the wall clock (an RTC
// ahead, corrected by NTP) lies in the future: the crash still waits only
// its backoff, not the size of the step.
func TestEngineBackoffIgnoresWallClockSteps(t *testing.T) {
	f := startEngine(t)
	f.send(testPod("u1", "web", v1.RestartPolicyAlways))
	waitFor(t, "first start", func() bool { return f.rt.startedCount() == 1 })
	f.rt.exit(f.rt.started[0].ID, 3)
	waitFor(t, "immediate restart", func() bool { return f.rt.startedCount() == 2 })
	second := f.rt.started[1].ID
	f.rt.mu.Lock()
	c := f.rt.containers[second]
	c.State, c.ExitCode, c.FinishedAt = StateExited, 3, f.clock.Now().Add(2*time.Hour)
	f.rt.mu.Unlock()
	f.rt.exits <- ExitEvent{ContainerID: second, PodUID: "u1", ExitCode: 3}
	waitFor(t, "CrashLoopBackOff", func() bool {
		p := f.status("u1")
		return p != nil && p.Status.ContainerStatuses[0].State.Waiting != nil &&
			p.Status.ContainerStatuses[0].State.Waiting.Reason == "CrashLoopBackOff"
	})
	waitFor(t, "a 10s backoff armed", func() bool { return f.clock.timerIn(10 * time.Second) })
	f.clock.Advance(10 * time.Second)
	waitFor(t, "restart after the 10s backoff, not after 2h", func() bool { return f.rt.startedCount() == 3 })
}

func TestBackoffWaitCountsFromWhenTheExitWasSeen(t *testing.T) {
	var b backoff
	now := time.Now()
	b.waitFor("a", now, now) // the first crash waits 0
	if w := b.waitFor("b", now.Add(-5*time.Second), now); w != 10*time.Second || b.until.Sub(now) != 5*time.Second {
		t.Fatalf("wait %v, left %v; want 10s of which 5s are left (the exit was 5s ago)", w, b.until.Sub(now))
	}
	if b.waitFor("c", now.Add(time.Hour), now); b.until.Sub(now) != 20*time.Second {
		t.Fatalf("an exit stamped in the future leaves %v, want the whole 20s", b.until.Sub(now))
	}
}

// A pod.json that cannot be written (a full disk, an SD card remounted
// read-only) holds no pod's supervision up: it starts, shows in the status
// and restarts, and the write is retried.
func TestEngineSupervisesWhenPodStateCannotBeWritten(t *testing.T) {
	f := startEngine(t)
	blocker := filepath.Join(f.e.cfg.StateDir, "pods", "u1", "pod.json", "x")
	if err := os.MkdirAll(blocker, 0o700); err != nil { // a directory where the file goes
		t.Fatal(err)
	}
	f.send(testPod("u1", "web", v1.RestartPolicyAlways))
	waitFor(t, "start", func() bool { return f.rt.startedCount() == 1 })
	waitFor(t, "status", func() bool { p := f.status("u1"); return p != nil && p.Status.Phase == v1.PodRunning })
	f.rt.exit(f.rt.started[0].ID, 1)
	waitFor(t, "restart after a crash", func() bool { return f.rt.startedCount() == 2 })
	if err := os.RemoveAll(filepath.Dir(blocker)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "pod.json written once the disk is back", func() bool {
		f.clock.Advance(time.Second) // the write's retry
		fi, err := os.Stat(filepath.Dir(blocker))
		return err == nil && fi.Mode().IsRegular()
	})
}

// A pod removed before its new worker's first sync is torn down, not a
// nil-pointer panic of the whole daemon.
func TestEngineKillBeforeTheFirstSync(t *testing.T) {
	clock := newFakeClock()
	f := &engineFixture{rt: newFakeRuntime(clock), net: &fakeNetwork{}, clock: clock, snaps: make(chan manifests.Snapshot)}
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	dir := t.TempDir()
	f.e = New(Config{NodeName: "n1", StateDir: dir + "/state", RunDir: dir + "/run", PodLogDir: dir + "/logs",
		ResolvConf: dir + "/none", Clock: clock,
		// Hold the worker at its first wake-up, before it reads its pod.
		OnActivity: func() { once.Do(func() { close(entered); <-release }) }}, f.rt, f.net)
	done := make(chan error, 1)
	go func() { done <- f.e.Run(t.Context(), f.snaps, 1) }()
	f.send(testPod("u1", "web", v1.RestartPolicyAlways))
	<-entered
	f.send() // the pod is gone before the worker looked at it
	close(release)
	waitFor(t, "sandbox torn down", func() bool { return slices.Contains(f.net.tornDown(), "u1") })
	select {
	case err := <-done:
		t.Fatalf("engine ended: %v", err)
	default:
	}
}

// An orphan known by its state directory alone (no pod.json, no
// containers) loses its log directory too, found by its UID.
func TestEngineRemovesLogsOfAnOrphanKnownByUIDOnly(t *testing.T) {
	clock := newFakeClock()
	f := &engineFixture{rt: newFakeRuntime(clock), net: &fakeNetwork{}, clock: clock, snaps: make(chan manifests.Snapshot)}
	dir := t.TempDir()
	cfg := Config{NodeName: "n1", StateDir: dir + "/state", RunDir: dir + "/run", PodLogDir: dir + "/logs",
		ResolvConf: dir + "/none", Clock: clock}
	logs := filepath.Join(cfg.PodLogDir, "default_old-n1_gone", "main")
	other := filepath.Join(cfg.PodLogDir, "default_x-n1_a_gone") // a UID may hold "_": not this pod's
	for _, d := range []string{filepath.Join(cfg.StateDir, "pods", "gone"), logs, other} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	// Links a pod planted in its log dir go, not what they name.
	host := t.TempDir()
	if err := os.WriteFile(filepath.Join(host, "precious"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{filepath.Join(logs, "0.log"): filepath.Join(host, "precious"), filepath.Join(logs, "side"): host} {
		if err := os.Symlink(target, name); err != nil {
			t.Fatal(err)
		}
	}
	f.e = New(cfg, f.rt, f.net)
	go f.e.Run(t.Context(), f.snaps, 1)
	f.send()
	waitFor(t, "orphan torn down", func() bool { return slices.Contains(f.net.tornDown(), "gone") })
	waitFor(t, "its logs removed", func() bool {
		_, err := os.Stat(filepath.Dir(logs))
		return os.IsNotExist(err)
	})
	if _, err := os.Stat(other); err != nil {
		t.Fatalf("another pod's logs went too: %v", err)
	}
	if _, err := os.Stat(filepath.Join(host, "precious")); err != nil {
		t.Errorf("removing the logs reached through a planted link: %v", err)
	}
}

// An exit whose pod could not be read from the container's labels still
// wakes the pod's worker (every worker), not only the next resync.
func TestEngineExitWithoutPodWakesEveryWorker(t *testing.T) {
	f := startEngine(t)
	f.send(testPod("u1", "web", v1.RestartPolicyAlways))
	waitFor(t, "start", func() bool { return f.rt.startedCount() == 1 })
	id := f.rt.started[0].ID
	f.rt.mu.Lock()
	c := f.rt.containers[id]
	c.State, c.ExitCode, c.FinishedAt = StateExited, 1, f.clock.Now()
	f.rt.mu.Unlock()
	f.rt.exits <- ExitEvent{ContainerID: id, ExitCode: 1} // no PodUID
	waitFor(t, "restart without a resync", func() bool { return f.rt.startedCount() == 2 })
}

// A kill that could not end the run (its shim stopped answering) leaves it
// Unknown: no replacement starts beside it.
func TestEngineNoReplacementBesideARunAKillLeftUnknown(t *testing.T) {
	f := startEngine(t)
	pod := testPod("u1", "web", v1.RestartPolicyAlways)
	f.send(pod)
	waitFor(t, "start", func() bool { return f.rt.startedCount() == 1 })
	f.rt.mu.Lock()
	f.rt.stopHangs = true
	f.rt.mu.Unlock()
	changed := pod.DeepCopy()
	changed.Spec.Containers[0].Args = []string{"changed"}
	f.send(changed)
	waitFor(t, "the kill", func() bool { return len(f.rt.callLog()) > 0 })
	time.Sleep(50 * time.Millisecond)
	f.clock.Advance(time.Minute) // retries and backoffs pass
	time.Sleep(50 * time.Millisecond)
	if n := f.rt.startedCount(); n != 1 {
		t.Fatalf("%d starts; a replacement started beside a run that may still be running", n)
	}
}

// Each restart keeps the current and the previous run's log, as the
// kubelet does, and removes older ones (with any rotated pieces).
func TestEngineKeepsTheCurrentAndPreviousRunsLogs(t *testing.T) {
	f := startEngine(t)
	pod := testPod("u1", "web", v1.RestartPolicyAlways)
	dir := filepath.Join(f.e.cfg.PodLogDir, "default_web-n1_u1", "main")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"0.log", "0.log.20260101-000000.gz", "1.log", "2.log", "other"} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// An earlier run with restart count 2 ended: the next start is run 3.
	f.rt.containers["old"] = &ContainerStatus{ID: "old", PodUID: "u1", PodName: pod.Name, PodNamespace: "default",
		Name: "main", SpecHash: specHash(&pod.Spec.Containers[0]), RestartCount: 2, State: StateExited, ExitCode: 1,
		FinishedAt: f.clock.Now().Add(-time.Hour), CreatedAt: f.clock.Now().Add(-2 * time.Hour)}
	f.send(pod)
	waitFor(t, "run 3 started", func() bool { return f.rt.startedCount() == 1 })
	// The worker prunes logs after the start returns.
	var left []string
	want := []string{"2.log", "other"}
	deadline := time.Now().Add(waitLimit)
	for !slices.Equal(left, want) {
		if time.Now().After(deadline) {
			t.Fatalf("log dir holds %v, want %v (run 2, the previous, and what is not a run's log)", left, want)
		}
		time.Sleep(2 * time.Millisecond)
		ents, _ := os.ReadDir(dir)
		left = left[:0]
		for _, e := range ents {
			left = append(left, e.Name())
		}
	}
}

// The pod files every container mounts live in the sandbox's run dir (a
// tmpfs on a host), written before the start, and none in the state dir.
// The pod files and termination messages are on a small tmpfs of the
// pod's own, not on the host's /run: a container writing into its
// /etc/hosts fills that (ENOSPC), and the tmpfs goes with the pod. With
// readOnlyRootFilesystem, /etc/hostname and /etc/resolv.conf are bound
// read-only, as CRI binds them; /etc/hosts stays writable, as the
// kubelet's own mount of it is.
func TestEnginePodFilesOnPodTmpfs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount")
	}
	f := startEngineWith(t, func(c *Config) { c.PodTmpfs = true })
	pod := testPod("u1", "web", v1.RestartPolicyAlways)
	ro := true
	pod.Spec.Containers[0].SecurityContext = &v1.SecurityContext{ReadOnlyRootFilesystem: &ro}
	pod.Spec.Containers[0].TerminationMessagePath = "/dev/termination-log"
	side := pod.Spec.Containers[0]
	side.Name, side.SecurityContext = "side", nil
	pod.Spec.Containers = append(pod.Spec.Containers, side)
	f.send(pod)
	waitFor(t, "start", func() bool { return f.rt.startedCount() == 2 })
	f.rt.mu.Lock()
	started := slices.Clone(f.rt.started)
	f.rt.mu.Unlock()
	dir := PodFilesDir(SandboxDir(f.e.cfg.RunDir, "u1"))
	for _, cfg := range started {
		roRoot := cfg.Container.Name == "main"
		for dest, wantRO := range map[string]bool{"/etc/hosts": false, "/etc/hostname": roRoot, "/etc/resolv.conf": roRoot, "/dev/termination-log": false} {
			var m *Mount
			for i := range cfg.Mounts {
				if cfg.Mounts[i].Destination == dest {
					m = &cfg.Mounts[i]
				}
			}
			if m == nil {
				t.Fatalf("%s: no mount at %s", cfg.Container.Name, dest)
			}
			if filepath.Dir(m.Source) != dir || m.ReadOnly != wantRO {
				t.Errorf("%s: %s from %s read-only %t; want a file in %s, read-only %t", cfg.Container.Name, dest, m.Source, m.ReadOnly, dir, wantRO)
			}
		}
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil || st.Type != unix.TMPFS_MAGIC {
		t.Fatalf("%s: statfs %v type %#x; want a tmpfs", dir, err, st.Type)
	}
	if size := int64(st.Blocks) * int64(st.Bsize); size < podFilesSlack || size > 2*podFilesSlack {
		t.Errorf("the pod files' tmpfs holds %d bytes; want the slack (%d) and the files", size, podFilesSlack)
	}
	hosts, err := os.OpenFile(filepath.Join(dir, hostsName), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = hosts.Write(make([]byte, 2*podFilesSlack))
	hosts.Close()
	if !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("writing 2 MiB into /etc/hosts: %v; want ENOSPC", err)
	}
	f.send()
	waitFor(t, "pod gone", func() bool { return f.status("u1") == nil })
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the pod files' dir after the pod went: %v", err)
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mounts), " "+dir+" ") {
		t.Fatalf("%s still mounted after the pod went", dir)
	}
}

func TestEnginePodFilesInRunDir(t *testing.T) {
	f := startEngine(t)
	f.send(testPod("u1", "web", v1.RestartPolicyAlways))
	waitFor(t, "start", func() bool { return f.rt.startedCount() == 1 })
	f.rt.mu.Lock()
	cfg := f.rt.started[0]
	f.rt.mu.Unlock()
	sbDir := PodFilesDir(SandboxDir(f.e.cfg.RunDir, "u1"))
	want := map[string]string{"/etc/hosts": "10.0.0.2\tweb-n1\n", "/etc/hostname": "web-n1\n", "/etc/resolv.conf": ""}
	for _, m := range cfg.Mounts {
		content, ok := want[m.Destination]
		if !ok {
			continue
		}
		delete(want, m.Destination)
		if filepath.Dir(m.Source) != sbDir {
			t.Errorf("%s mounted from %s, want a file in %s", m.Destination, m.Source, sbDir)
		}
		b, err := os.ReadFile(m.Source)
		if err != nil || !strings.Contains(string(b), content) {
			t.Errorf("%s: %q (%v), want it to hold %q", m.Source, b, err, content)
		}
	}
	if len(want) != 0 {
		t.Errorf("not mounted: %v", want)
	}
	for _, name := range []string{"hosts", "hostname", "resolv.conf"} {
		if _, err := os.Stat(filepath.Join(f.e.cfg.StateDir, "pods", "u1", name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s in the state dir: %v", name, err)
		}
	}
}
