package prober

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The worker tests run in a synctest bubble: time only moves when every
// goroutine waits, so a probe's tick falls on the exact second the
// kubelet's would, and each check happens once the workers are idle.

// script is the exec side of the worker tests: each probe's command names
// it ("live", "ready", "start"), and its exit codes are played in order
// (the last one repeats).
type script struct {
	mu       sync.Mutex
	start    time.Time
	codes    map[string][]int
	err      map[string]error
	attempts []string // "ready@20s"
	changes  int
	failures []string // "Readiness: ready failed"
	errors   []string
}

func (s *script) exec(_ context.Context, _ string, cmd []string, _ time.Duration) ([]byte, int, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	name := cmd[0]
	s.attempts = append(s.attempts, fmt.Sprintf("%s@%v", name, time.Since(s.start)))
	if err := s.err[name]; err != nil {
		return nil, 0, false, err
	}
	code := 0
	if codes := s.codes[name]; len(codes) > 0 {
		code = codes[0]
		if len(codes) > 1 {
			s.codes[name] = codes[1:]
		}
	}
	return []byte(name + " failed"), code, false, nil
}

// set replaces a probe's remaining exit codes.
func (s *script) set(name string, codes ...int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.codes[name] = codes
}

func (s *script) took() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.attempts)
}

type harness struct {
	*script
	m   *Manager
	pod *v1.Pod
}

// newHarness starts a manager in the bubble with the pod declared at time
// 0 and its workers idle. started is how long before that noderun started;
// rnd is the random source's answer.
func newHarness(t *testing.T, pod *v1.Pod, started time.Duration, rnd float64) *harness {
	s := &script{start: time.Now(), codes: map[string][]int{}, err: map[string]error{}}
	m := NewManager(Config{
		Exec:     s.exec,
		OnChange: func(string) { s.mu.Lock(); s.changes++; s.mu.Unlock() },
		OnProbeFailure: func(uid, c string, k Kind, msg string) {
			s.mu.Lock()
			s.failures = append(s.failures, k.String()+": "+msg)
			s.mu.Unlock()
		},
		OnProbeError: func(uid, c string, k Kind, err error) {
			s.mu.Lock()
			s.errors = append(s.errors, k.String()+": "+err.Error())
			s.mu.Unlock()
		},
		Rand:    func() float64 { return rnd },
		Started: time.Now().Add(-started),
	})
	t.Cleanup(m.Stop)
	m.SetPod(pod, "10.0.0.2")
	synctest.Wait()
	return &harness{script: s, m: m, pod: pod}
}

// at sleeps until the given time since the start, then lets the workers
// finish what falls due then.
func (h *harness) at(d time.Duration) {
	time.Sleep(d - time.Since(h.start))
	synctest.Wait()
}

// run starts the container's run id now.
func (h *harness) run(id string) {
	h.m.SetContainer(h.pod.UID, "app", id, time.Now())
}

func (h *harness) result(k Kind, id string) Result {
	r, _ := h.m.Result(h.pod.UID, "app", k, id)
	return r
}

func probe(cmd string, period, delay, success, failure int32) *v1.Probe {
	return &v1.Probe{ProbeHandler: v1.ProbeHandler{Exec: &v1.ExecAction{Command: []string{cmd}}},
		PeriodSeconds: period, InitialDelaySeconds: delay, TimeoutSeconds: 1, SuccessThreshold: success, FailureThreshold: failure}
}

func podWith(c v1.Container) *v1.Pod {
	c.Name = "app"
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "u1", Name: "p"}, Spec: v1.PodSpec{Containers: []v1.Container{c}}}
}

const long = time.Hour // noderun started long before: no start-up jitter

func sec(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// TestScheduleOfTheTCPExample is tcp-liveness-readiness.yaml's schedule:
// both probes have initialDelaySeconds 15 and periodSeconds 10; the
// container runs 2 s after the pod was admitted. Liveness ticks from the
// admission (0, 10, 20); readiness runs when the container starts and its
// ticks restart from there (2, 12, 22). Each first probe comes at its
// first tick at least 15 s after the start.
func TestScheduleOfTheTCPExample(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, podWith(v1.Container{LivenessProbe: probe("live", 10, 15, 1, 3), ReadinessProbe: probe("ready", 10, 15, 1, 3)}), long, 0)
		h.at(2 * time.Second)
		h.run("c1")
		h.at(sec(21.5))
		if h.m.Ready("u1", "app", "c1") {
			t.Error("ready at 21.5 s, before readiness's first probe at 22 s")
		}
		h.at(sec(32.5))
		if want := []string{"live@20s", "ready@22s", "live@30s", "ready@32s"}; !slices.Equal(h.took(), want) {
			t.Errorf("probes %v, want %v", h.took(), want)
		}
		if !h.m.Ready("u1", "app", "c1") || h.changes != 1 {
			t.Errorf("ready %t with %d changes after the first success", h.m.Ready("u1", "app", "c1"), h.changes)
		}
	})
}

// TestThresholds plays exit codes against the thresholds; a check follows
// each attempt. Readiness is probed when the run starts (0 s) and every
// second; liveness and startup at their ticks (1 s, 2 s, ...).
func TestThresholds(t *testing.T) {
	S, F, U := Success, Failure, Unknown
	for _, tc := range []struct {
		name     string
		kind     Kind
		success  int32
		failure  int32
		codes    []int
		want     []Result // after each attempt
		attempts int      // in all: fewer than codes once held
		changes  int
	}{
		{"readiness, defaults", Readiness, 0, 0, []int{0, 1, 1, 1, 0}, []Result{S, S, S, F, S}, 5, 3},
		{"readiness, success 2 failure 1", Readiness, 2, 1, []int{0, 0, 1, 0, 0}, []Result{F, S, F, F, S}, 5, 3},
		{"readiness, failures not in a row", Readiness, 1, 2, []int{0, 1, 0, 1, 0}, []Result{S, S, S, S, S}, 5, 1},
		{"liveness holds after failing", Liveness, 1, 3, []int{1, 1, 0, 1, 1, 1, 0, 0}, []Result{S, S, S, S, S, F, F, F}, 6, 1},
		{"startup holds after succeeding", Startup, 1, 3, []int{1, 1, 0, 1}, []Result{U, U, S, S}, 3, 1},
		{"startup holds after failing", Startup, 1, 2, []int{1, 1, 0}, []Result{U, F, F}, 2, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := v1.Container{}
				p := probe("check", 1, 0, tc.success, tc.failure)
				*[...]**v1.Probe{&c.LivenessProbe, &c.ReadinessProbe, &c.StartupProbe}[tc.kind] = p
				h := newHarness(t, podWith(c), long, 0)
				h.set("check", tc.codes...)
				h.run("c1")
				first := time.Second
				if tc.kind == Readiness {
					first = 0
				}
				for i, want := range tc.want {
					h.at(first + time.Duration(i)*time.Second + 500*time.Millisecond)
					if got := h.result(tc.kind, "c1"); got != want {
						t.Fatalf("after attempt %d (%v): %v, want %v", i+1, h.took(), got, want)
					}
				}
				if n := len(h.took()); n != tc.attempts || h.changes != tc.changes {
					t.Errorf("%d attempts and %d changes, want %d and %d", n, h.changes, tc.attempts, tc.changes)
				}
				failed := 0
				for _, code := range tc.codes[:tc.attempts] {
					if code != 0 {
						failed++
					}
				}
				if len(h.failures) != failed {
					t.Errorf("%d failure reports, want one per failed attempt (%d): %v", len(h.failures), failed, h.failures)
				}
			})
		})
	}
}

// TestNewRunStartsOver: a held liveness worker resumes for the next run,
// from the initial results, on its old schedule.
func TestNewRunStartsOver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, podWith(v1.Container{LivenessProbe: probe("live", 1, 0, 1, 2), ReadinessProbe: probe("ready", 10, 0, 1, 1)}), long, 0)
		h.set("live", 1)
		h.run("c1")
		h.at(sec(5.5))
		if got := h.result(Liveness, "c1"); got != Failure {
			t.Fatalf("liveness %v after failing at 1 s and 2 s", got)
		}
		if want := []string{"ready@0s", "live@1s", "live@2s"}; !slices.Equal(h.took(), want) {
			t.Fatalf("probes %v, want %v: liveness holds once it reported the failure", h.took(), want)
		}
		h.set("live", 0)
		// Held so that the new run's first probes cannot land before the
		// checks of its initial results.
		h.script.mu.Lock()
		h.run("c2")
		live, ready, isReady := h.result(Liveness, "c2"), h.result(Readiness, "c2"), h.m.Ready("u1", "app", "c2")
		h.script.mu.Unlock()
		if live != Success || ready != Failure || isReady {
			t.Errorf("new run: liveness %v readiness %v ready %t, want the initial Success and Failure, not ready", live, ready, isReady)
		}
		if _, ok := h.m.Result("u1", "app", Liveness, "c1"); ok {
			t.Error("a result is still given for the old run")
		}
		h.at(sec(6.5))
		if want := []string{"ready@0s", "live@1s", "live@2s", "ready@5.5s", "live@6s"}; !slices.Equal(h.took(), want) {
			t.Errorf("probes %v, want %v", h.took(), want)
		}
		if !h.m.Ready("u1", "app", "c2") {
			t.Error("the new run is not ready after its readiness probe passed")
		}
	})
}

// TestStartupGates: liveness and readiness wait for the startup probe;
// its success runs readiness at once (and restarts readiness's period),
// and the startup probe stops.
func TestStartupGates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, podWith(v1.Container{
			StartupProbe:   probe("start", 10, 0, 1, 30),
			LivenessProbe:  probe("live", 3, 0, 1, 1),
			ReadinessProbe: probe("ready", 7, 0, 1, 1),
		}), long, 0)
		h.set("start", 1, 0)
		h.set("live", 1) // would kill the container at once if it ran
		h.run("c1")
		h.at(sec(19.5))
		if h.m.Started("u1", "app", "c1") || h.m.Ready("u1", "app", "c1") {
			t.Fatal("started or ready before the startup probe succeeded")
		}
		if want := []string{"start@10s"}; !slices.Equal(h.took(), want) {
			t.Fatalf("probes %v, want %v", h.took(), want)
		}
		h.at(sec(20.5))
		if !h.m.Started("u1", "app", "c1") || !h.m.Ready("u1", "app", "c1") {
			t.Fatalf("started %t ready %t after the startup probe succeeded at 20 s", h.m.Started("u1", "app", "c1"), h.m.Ready("u1", "app", "c1"))
		}
		h.set("live", 0)
		h.at(sec(28.5))
		want := []string{"start@10s", "start@20s", "ready@20s", "live@21s", "live@24s", "ready@27s", "live@27s"}
		if got := h.took(); !slices.Equal(sorted(got[3:]), sorted(want[3:])) || !slices.Equal(got[:3], want[:3]) {
			t.Errorf("probes %v, want %v", got, want)
		}
		// A new startup probe has not succeeded yet: not started, so not
		// ready either, whatever readiness said. With no start-up jitter
		// its worker may probe before the checks below: that probe fails.
		h.set("start", 1)
		changed := h.pod.DeepCopy()
		changed.Spec.Containers[0].StartupProbe.PeriodSeconds = 20
		h.m.SetPod(changed, "10.0.0.2")
		if h.m.Started("u1", "app", "c1") || h.m.Ready("u1", "app", "c1") || h.result(Readiness, "c1") != Success {
			t.Errorf("with a new startup probe: started %t ready %t readiness %v; want false, false, Success",
				h.m.Started("u1", "app", "c1"), h.m.Ready("u1", "app", "c1"), h.result(Readiness, "c1"))
		}
	})
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// TestReadinessRunsWhenTheContainerStarts: the kubelet's manual run when a
// container is found started restarts readiness's period from then.
func TestReadinessRunsWhenTheContainerStarts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, podWith(v1.Container{ReadinessProbe: probe("ready", 10, 0, 1, 3)}), long, 0)
		h.at(3 * time.Second)
		h.run("c1")
		h.run("c1") // the same run again: nothing new
		h.at(sec(23.5))
		if want := []string{"ready@3s", "ready@13s", "ready@23s"}; !slices.Equal(h.took(), want) {
			t.Errorf("probes %v, want %v", h.took(), want)
		}
	})
}

// TestFirstProbeSpread: the kubelet's start-up jitter (noderun started
// less than a period ago) and the small spread of other new workers.
func TestFirstProbeSpread(t *testing.T) {
	for _, tc := range []struct {
		name    string
		started time.Duration
		period  int32
		rnd     float64
		want    []string // until 25 s
	}{
		{"noderun just started: half the period", 0, 10, 0.5, []string{"live@5s", "live@15s", "live@25s"}},
		{"noderun started 9 s ago", 9 * time.Second, 10, 0.9, []string{"live@9s", "live@19s"}},
		{"long running: a twentieth of the period", long, 10, 0.5, []string{"live@500ms", "live@10.5s", "live@20.5s"}},
		{"long running: at most a second", long, 60, 0.99, []string{"live@990ms"}},
		{"long running, short period", long, 2, 0.5, []string{"live@100ms", "live@2.1s", "live@4.1s", "live@6.1s", "live@8.1s",
			"live@10.1s", "live@12.1s", "live@14.1s", "live@16.1s", "live@18.1s", "live@20.1s", "live@22.1s", "live@24.1s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				pod := podWith(v1.Container{LivenessProbe: probe("live", tc.period, 0, 1, 3)})
				s := &script{start: time.Now(), codes: map[string][]int{}}
				m := NewManager(Config{Exec: s.exec, Rand: func() float64 { return tc.rnd }, Started: time.Now().Add(-tc.started)})
				defer m.Stop()
				m.SetPod(pod, "10.0.0.2")
				m.SetContainer("u1", "app", "c1", time.Now())
				time.Sleep(25*time.Second + time.Millisecond)
				synctest.Wait()
				if !slices.Equal(s.took(), tc.want) {
					t.Errorf("probes %v, want %v", s.took(), tc.want)
				}
			})
		})
	}
}

// TestTriggerDuringStartupJitter: a run that starts while the worker waits
// out its jitter is probed right after the first probe, as the kubelet's
// worker does after its sleep.
func TestTriggerDuringStartupJitter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, podWith(v1.Container{ReadinessProbe: probe("ready", 10, 0, 1, 3)}), 0, 0.5)
		h.at(time.Second)
		h.run("c1")
		h.at(sec(15.5))
		if want := []string{"ready@5s", "ready@5s", "ready@15s"}; !slices.Equal(h.took(), want) {
			t.Errorf("probes %v, want %v", h.took(), want)
		}
	})
}

// TestNextTick is time.Ticker's delivery to a receiver busy for a while.
func TestNextTick(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		last, now float64 // seconds after t0
		period    time.Duration
		wait, at  float64
	}{
		{0, 0.2, time.Second, 0.8, 1},    // a quick probe: the next tick
		{0, 1, time.Second, 0, 1},        // just due
		{0, 1.5, time.Second, 0, 1},      // one came due meanwhile: at once
		{0, 3.7, time.Second, 0, 3},      // several: one at once, the rest dropped
		{3, 3.9, time.Second, 0.1, 4},    // and the phase stays
		{0, 15, 10 * time.Second, 0, 10}, // a timeout longer than the period
	} {
		wait, at := nextTick(t0.Add(sec(tc.last)), t0.Add(sec(tc.now)), tc.period)
		if wait != sec(tc.wait) || !at.Equal(t0.Add(sec(tc.at))) {
			t.Errorf("nextTick(%v, %v, %s) = %s, %v; want %v, %v", tc.last, tc.now, tc.period, wait, at.Sub(t0).Seconds(), tc.wait, tc.at)
		}
	}
}

// TestAttemptThatCannotBeMade: tried three times in a row, reported once,
// and thrown away: the result stays.
func TestAttemptThatCannotBeMade(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, podWith(v1.Container{LivenessProbe: probe("live", 1, 0, 1, 1)}), long, 0)
		h.err["live"] = errors.New("exec: container is stopping")
		h.run("c1")
		h.at(sec(2.5))
		if n := len(h.took()); n != 6 || len(h.errors) != 2 || len(h.failures) != 0 {
			t.Errorf("%d attempts, %d errors, %d failures in two ticks; want 6, 2, 0", n, len(h.errors), len(h.failures))
		}
		if got := h.result(Liveness, "c1"); got != Success || h.changes != 0 {
			t.Errorf("liveness %v after errors (%d changes), want it unchanged", got, h.changes)
		}
		if len(h.errors) > 0 && h.errors[0] != "Liveness: exec: container is stopping" {
			t.Errorf("error report %q", h.errors[0])
		}
	})
}

// TestSuccessRunCarriesOver: as in the kubelet's worker, the count of
// results in a row is not reset for a new run, so a readiness probe with
// successThreshold 2 that was passing makes the next run ready at its
// first success.
func TestSuccessRunCarriesOver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, podWith(v1.Container{ReadinessProbe: probe("ready", 1, 0, 2, 3)}), long, 0)
		h.run("c1")
		h.at(sec(0.5))
		if h.m.Ready("u1", "app", "c1") {
			t.Fatal("ready after one success; the threshold is 2")
		}
		h.at(sec(1.5))
		if !h.m.Ready("u1", "app", "c1") {
			t.Fatal("not ready after two successes")
		}
		h.script.mu.Lock() // the new run's first probe waits for the check
		h.run("c2")
		early := h.m.Ready("u1", "app", "c2")
		h.script.mu.Unlock()
		if early {
			t.Fatal("a new run is ready before its first probe")
		}
		synctest.Wait()
		if !h.m.Ready("u1", "app", "c2") {
			t.Error("the new run is not ready after its first success")
		}
	})
}

// TestContainerStops: nothing is probed while the container does not run,
// and its last run's results stay.
func TestContainerStops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, podWith(v1.Container{ReadinessProbe: probe("ready", 1, 0, 1, 3)}), long, 0)
		h.run("c1")
		h.at(sec(1.5))
		h.m.SetContainer("u1", "app", "", time.Time{})
		h.at(sec(5.5))
		if want := []string{"ready@0s", "ready@1s"}; !slices.Equal(h.took(), want) {
			t.Errorf("probes %v, want %v", h.took(), want)
		}
		if !h.m.Ready("u1", "app", "c1") {
			t.Error("the stopped run's result changed")
		}
	})
}

// TestSetPod: workers follow the declared probes.
func TestSetPod(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		always := v1.ContainerRestartPolicyAlways
		pod := podWith(v1.Container{ReadinessProbe: probe("ready", 1, 0, 1, 1)})
		pod.Spec.InitContainers = []v1.Container{
			{Name: "sidecar", RestartPolicy: &always, LivenessProbe: probe("sidecar", 1, 0, 1, 1)},
			{Name: "init", LivenessProbe: probe("init", 1, 0, 1, 1)}, // not probed: runs to completion
		}
		h := newHarness(t, pod, long, 0)
		h.run("c1")
		h.m.SetContainer("u1", "sidecar", "s1", time.Now())
		h.m.SetContainer("u1", "init", "i1", time.Now())
		h.at(sec(1.5))
		if want := []string{"ready@0s", "ready@1s", "sidecar@1s"}; !slices.Equal(sorted(h.took()), sorted(want)) {
			t.Fatalf("probes %v, want %v", h.took(), want)
		}
		if _, ok := h.m.Result("u1", "init", Liveness, "i1"); ok {
			t.Error("a regular init container has a liveness result")
		}

		// The same spec in a new object: workers and results stay.
		h.m.SetPod(pod.DeepCopy(), "10.0.0.2")
		if !h.m.Ready("u1", "app", "c1") {
			t.Fatal("an unchanged probe lost its result")
		}
		// A changed probe starts over, from the initial result and with a
		// new worker (probing at once).
		changed := pod.DeepCopy()
		changed.Spec.Containers[0].ReadinessProbe.PeriodSeconds = 5
		changed.Spec.InitContainers = nil
		// Held so that the new worker's first probe cannot land before the
		// check below (the bubble's goroutines run for real).
		h.script.mu.Lock()
		h.m.SetPod(changed, "10.0.0.2")
		kept := h.m.Ready("u1", "app", "c1")
		h.script.mu.Unlock()
		if kept {
			t.Fatal("a changed probe kept its result")
		}
		synctest.Wait()
		if !h.m.Ready("u1", "app", "c1") {
			t.Fatal("the new worker did not probe at once")
		}
		before := len(h.took())
		h.at(sec(6.5))
		// ready@1.5s (new worker), then every 5 s: 6.5 s; no sidecar anymore.
		if got := h.took()[before:]; !slices.Equal(got, []string{"ready@6.5s"}) {
			t.Errorf("probes after the change %v, want [ready@6.5s]", got)
		}
		if _, ok := h.m.Result("u1", "sidecar", Liveness, "s1"); ok {
			t.Error("a container gone from the spec still has a result")
		}

		h.m.RemovePod("u1")
		before = len(h.took())
		h.at(sec(20))
		if len(h.took()) != before {
			t.Errorf("probed %v after the pod was removed", h.took()[before:])
		}
		if _, ok := h.m.Result("u1", "app", Readiness, "c1"); ok || !h.m.Ready("u1", "app", "c1") {
			t.Error("a removed pod still has probe results")
		}
	})
}

// TestStopEndsWorkers: Stop returns once every worker ended, also one in
// the middle of an attempt (synctest fails a bubble with goroutines left).
func TestStopEndsWorkers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		entered := make(chan struct{})
		m := NewManager(Config{Exec: func(ctx context.Context, _ string, _ []string, _ time.Duration) ([]byte, int, bool, error) {
			close(entered)
			<-ctx.Done()
			return nil, 0, false, ctx.Err()
		}})
		m.SetPod(podWith(v1.Container{LivenessProbe: probe("live", 1, 0, 1, 1)}), "10.0.0.2")
		m.SetContainer("u1", "app", "c1", time.Now())
		<-entered
		m.Stop()
	})
}
