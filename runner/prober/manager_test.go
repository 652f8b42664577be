package prober

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// fakeClock fires timers only when Advance passes them.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	c      *fakeClock
	ch     chan time.Time
	at     time.Time
	active bool
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

func (c *fakeClock) NewTimer(d time.Duration) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, ch: make(chan time.Time, 1), at: c.now.Add(d), active: true}
	c.timers = append(c.timers, t)
	if d <= 0 {
		t.active = false
		t.ch <- c.now
	}
	return t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	for _, t := range c.timers {
		if t.active && !t.at.After(c.now) {
			t.active = false
			select {
			case t.ch <- c.now:
			default:
			}
		}
	}
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }
func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.active
	t.active = false
	return was
}
func (t *fakeTimer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.active
	t.at, t.active = t.c.now.Add(d), true
	return was
}

// scripted is an Execer whose exit code the test sets; it counts calls.
type scripted struct {
	code  atomic.Int32
	calls atomic.Int32
}

func (s *scripted) exec(context.Context, string, []string, time.Duration) ([]byte, int, bool, error) {
	s.calls.Add(1)
	return nil, int(s.code.Load()), false, nil
}

type fixture struct {
	t       *testing.T
	m       *Manager
	clock   *fakeClock
	exec    *scripted
	changes atomic.Int32
	fails   atomic.Int32
	pod     *v1.Pod
}

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// newFixture starts a manager an hour after "noderun started", so no
// start-up jitter applies unless a test asks for it.
func newFixture(t *testing.T, c v1.Container) *fixture {
	f := &fixture{t: t, clock: &fakeClock{now: t0}, exec: &scripted{}}
	f.m = NewManager(Config{
		Exec:           f.exec.exec,
		OnChange:       func(string) { f.changes.Add(1) },
		OnProbeFailure: func(string, string, Kind, string) { f.fails.Add(1) },
		Clock:          f.clock,
		Started:        t0.Add(-time.Hour),
	})
	t.Cleanup(f.m.Stop)
	f.pod = &v1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "u1"}, Spec: v1.PodSpec{Containers: []v1.Container{c}}}
	f.m.SetPod(f.pod, "10.0.0.2")
	f.settle() // the workers' first probe: nothing runs yet
	return f
}

func execProbe(period, delay, success, failure int32) *v1.Probe {
	return &v1.Probe{ProbeHandler: v1.ProbeHandler{Exec: &v1.ExecAction{Command: []string{"check"}}},
		PeriodSeconds: period, InitialDelaySeconds: delay, TimeoutSeconds: 1, SuccessThreshold: success, FailureThreshold: failure}
}

// settle gives the workers a moment to act on what the test just did.
func (f *fixture) settle() { time.Sleep(15 * time.Millisecond) }

// tick advances the clock one second at a time.
func (f *fixture) tick(seconds int) {
	for range seconds {
		f.clock.Advance(time.Second)
		f.settle()
	}
}

func (f *fixture) calls() int { return int(f.exec.calls.Load()) }

func TestReadinessWaitsForInitialDelayThenTicks(t *testing.T) {
	// The tcp-liveness-readiness example: initialDelay 15, period 10.
	f := newFixture(t, v1.Container{Name: "app", ReadinessProbe: execProbe(10, 15, 1, 3)})
	f.settle()
	f.m.SetContainer("u1", "app", "c1", t0)
	f.settle()
	if f.m.Ready("u1", "app", "c1") {
		t.Fatal("ready before any probe")
	}
	f.tick(19)
	if n := f.calls(); n != 0 {
		t.Fatalf("%d probes before the tick at 20s (ticks at 0 and 10 fall in the initial delay)", n)
	}
	f.tick(1)
	if n := f.calls(); n != 1 || !f.m.Ready("u1", "app", "c1") {
		t.Fatalf("at 20s: %d probes, ready %t; want 1 and ready", n, f.m.Ready("u1", "app", "c1"))
	}
	if f.changes.Load() == 0 {
		t.Error("no change reported when readiness became Success")
	}
	// Readiness goes back to false after failureThreshold failures.
	f.exec.code.Store(1)
	f.tick(20)
	if !f.m.Ready("u1", "app", "c1") {
		t.Fatal("unready after 2 failures; the threshold is 3")
	}
	f.tick(10)
	if f.m.Ready("u1", "app", "c1") {
		t.Fatal("still ready after 3 failures")
	}
	if n := f.fails.Load(); n != 3 {
		t.Errorf("%d failure reports, want one per failed attempt (3)", n)
	}
}

func TestLivenessFailureHoldsUntilANewRun(t *testing.T) {
	f := newFixture(t, v1.Container{Name: "app", LivenessProbe: execProbe(1, 0, 1, 3)})
	f.m.SetContainer("u1", "app", "c1", t0)
	f.settle()
	if r, ok := f.m.Result("u1", "app", Liveness, "c1"); !ok || r != Success {
		t.Fatalf("initial liveness %v %t, want Success", r, ok)
	}
	f.exec.code.Store(1)
	f.tick(2)
	if r, _ := f.m.Result("u1", "app", Liveness, "c1"); r != Success {
		t.Fatalf("liveness %v below the threshold", r)
	}
	f.tick(1)
	if r, _ := f.m.Result("u1", "app", Liveness, "c1"); r != Failure {
		t.Fatalf("liveness %v after 3 failures, want Failure", r)
	}
	held := f.calls()
	f.tick(3)
	if f.calls() != held {
		t.Fatalf("probed %d more times after reporting the failure; it must hold until the container changes", f.calls()-held)
	}
	// The restarted container starts over.
	f.exec.code.Store(0)
	f.m.SetContainer("u1", "app", "c2", f.clock.Now())
	if r, ok := f.m.Result("u1", "app", Liveness, "c2"); !ok || r != Success {
		t.Fatalf("liveness of the new run %v %t, want Success", r, ok)
	}
	if _, ok := f.m.Result("u1", "app", Liveness, "c1"); ok {
		t.Error("a result is still given for the old run")
	}
	f.tick(1)
	if f.calls() == held {
		t.Error("the new run is not probed")
	}
}

func TestStartupGatesLivenessAndReadiness(t *testing.T) {
	c := v1.Container{Name: "app", StartupProbe: execProbe(10, 0, 1, 30), LivenessProbe: execProbe(1, 0, 1, 1), ReadinessProbe: execProbe(10, 0, 1, 1)}
	f := newFixture(t, c)
	f.exec.code.Store(1) // not started yet: startup fails, below its threshold
	f.m.SetContainer("u1", "app", "c1", t0)
	f.tick(5)
	if f.m.Started("u1", "app", "c1") || f.m.Ready("u1", "app", "c1") {
		t.Fatal("started or ready before the startup probe succeeded")
	}
	// The startup probe's first tick (at 0) came before the container ran
	// and its next is at 10; liveness (every 1 s) must not run meanwhile.
	if n := f.calls(); n != 0 {
		t.Fatalf("%d probes before the startup probe's tick at 10 s", n)
	}
	if r, _ := f.m.Result("u1", "app", Liveness, "c1"); r != Success {
		t.Fatalf("liveness %v while not started", r)
	}
	f.exec.code.Store(0)
	f.tick(5) // startup's tick at 10 succeeds, and readiness probes at once
	if !f.m.Started("u1", "app", "c1") || !f.m.Ready("u1", "app", "c1") {
		t.Fatalf("started %t ready %t after the startup probe succeeded", f.m.Started("u1", "app", "c1"), f.m.Ready("u1", "app", "c1"))
	}
	before := f.calls()
	f.tick(10)
	// Ten liveness ticks and one readiness tick; the startup probe is done.
	if n := f.calls() - before; n != 11 {
		t.Errorf("%d probes in 10 s after start, want 11 (liveness every 1 s, readiness every 10 s, no startup)", n)
	}
}

func TestSuccessThreshold(t *testing.T) {
	f := newFixture(t, v1.Container{Name: "app", ReadinessProbe: execProbe(1, 0, 3, 1)})
	f.m.SetContainer("u1", "app", "c1", t0)
	f.tick(2) // probes at 0 (triggered), 1, 2
	if !f.m.Ready("u1", "app", "c1") {
		t.Fatalf("not ready after %d successes (threshold 3)", f.calls())
	}
	f.exec.code.Store(1)
	f.tick(1)
	f.exec.code.Store(0)
	f.tick(2)
	if f.m.Ready("u1", "app", "c1") {
		t.Fatal("ready again after 2 successes following a failure")
	}
	f.tick(1)
	if !f.m.Ready("u1", "app", "c1") {
		t.Fatal("not ready after 3 successes")
	}
}

func TestStartupJitterSpreadsFirstProbes(t *testing.T) {
	clock := &fakeClock{now: t0}
	exec := &scripted{}
	m := NewManager(Config{Exec: exec.exec, Clock: clock, Started: t0, Rand: func() float64 { return 0.5 }})
	defer m.Stop()
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{UID: types.UID("u1")},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "app", LivenessProbe: execProbe(10, 0, 1, 3)}}}}
	m.SetPod(pod, "10.0.0.2")
	m.SetContainer("u1", "app", "c1", t0)
	for range 4 {
		clock.Advance(time.Second)
		time.Sleep(15 * time.Millisecond)
	}
	if n := exec.calls.Load(); n != 0 {
		t.Fatalf("probed %d times in the first 4 s; noderun just started, so the first probe waits half the period", n)
	}
	clock.Advance(time.Second)
	time.Sleep(15 * time.Millisecond)
	if n := exec.calls.Load(); n != 1 {
		t.Fatalf("%d probes at 5 s, want 1", n)
	}
}

func TestSetPodKeepsWorkersOfUnchangedProbes(t *testing.T) {
	f := newFixture(t, v1.Container{Name: "app", ReadinessProbe: execProbe(1, 0, 1, 1)})
	f.m.SetContainer("u1", "app", "c1", t0)
	f.tick(1)
	if !f.m.Ready("u1", "app", "c1") {
		t.Fatal("not ready")
	}
	// The same spec in a new object: results stay.
	f.m.SetPod(f.pod.DeepCopy(), "10.0.0.2")
	if !f.m.Ready("u1", "app", "c1") {
		t.Fatal("an unchanged probe lost its result")
	}
	// A changed probe starts over.
	changed := f.pod.DeepCopy()
	changed.Spec.Containers[0].ReadinessProbe.PeriodSeconds = 2
	f.m.SetPod(changed, "10.0.0.2")
	if f.m.Ready("u1", "app", "c1") {
		t.Fatal("a changed probe kept the old result")
	}
	f.m.RemovePod("u1")
	if !f.m.Ready("u1", "app", "c1") {
		t.Error("a removed pod's container still has a readiness probe")
	}
}
