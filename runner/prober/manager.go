package prober

import (
	"context"
	"math/rand/v2"
	"reflect"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Kind is which of a container's probes.
type Kind int

const (
	Liveness Kind = iota
	Readiness
	Startup
	nKinds
)

func (k Kind) String() string {
	return [...]string{"Liveness", "Readiness", "Startup"}[k]
}

// initial is a probe's result before it has concluded anything, as the
// kubelet sets it: not ready, alive, startup unknown.
func (k Kind) initial() Result {
	return [...]Result{Success, Failure, Unknown}[k]
}

// Clock is the manager's view of time, so tests can drive the workers.
type Clock interface {
	Now() time.Time
	NewTimer(d time.Duration) Timer
}

// Timer is the part of *time.Timer the workers use.
type Timer interface {
	C() <-chan time.Time
	Stop() bool
	Reset(d time.Duration) bool
}

// Config wires a Manager.
type Config struct {
	Exec Execer
	// OnChange is called (from a worker; it must not block) when a
	// container's result changed.
	OnChange func(podUID string)
	// OnProbeFailure, if set, is called for every failed attempt, also
	// below the failure threshold (the kubelet's Unhealthy event).
	OnProbeFailure func(podUID, container string, kind Kind, msg string)
	Clock          Clock
	Rand           func() float64 // in [0,1), for the start-up jitter
	Started        time.Time      // when noderun started
}

// Manager runs one worker per probe of every container of every pod.
type Manager struct {
	cfg    Config
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu   sync.Mutex
	pods map[types.UID]*podProbes
}

type podProbes struct {
	uid        types.UID
	spec       *v1.Pod // the pod object last declared: the same one costs nothing
	ip         string
	containers map[string]*containerProbes
}

// containerProbes is one container's probes and its current run.
type containerProbes struct {
	pod       *podProbes
	spec      *v1.Container
	id        string // the running run, "" when none
	startedAt time.Time
	workers   [nKinds]*worker
}

// worker runs one probe on its period. Its result fields are guarded by
// the manager's lock.
type worker struct {
	m       *Manager
	c       *containerProbes
	kind    Kind
	probe   *v1.Probe
	ctx     context.Context
	cancel  context.CancelFunc
	trigger chan struct{}

	id         string // the run result is for
	result     Result
	lastResult Result
	resultRun  int  // consecutive attempts with lastResult
	onHold     bool // a liveness or startup failure was reported for this run
}

// NewManager returns a manager; Stop ends its workers.
func NewManager(cfg Config) *Manager {
	if cfg.Clock == nil {
		cfg.Clock = realClock{}
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Float64
	}
	if cfg.Started.IsZero() {
		cfg.Started = cfg.Clock.Now()
	}
	if cfg.OnChange == nil {
		cfg.OnChange = func(string) {}
	}
	m := &Manager{cfg: cfg, pods: map[types.UID]*podProbes{}}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	return m
}

// SetPod declares a pod's probed containers (app containers and sidecars)
// and the address probes reach it at. Workers start for new probes and
// stop for removed or changed ones; an unchanged pod costs a map lookup.
func (m *Manager) SetPod(pod *v1.Pod, podIP string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	pp := m.pods[pod.UID]
	if pp != nil && pp.spec == pod && pp.ip == podIP {
		return
	}
	if pp == nil {
		pp = &podProbes{uid: pod.UID, containers: map[string]*containerProbes{}}
		m.pods[pod.UID] = pp
	}
	pp.spec, pp.ip = pod, podIP
	seen := map[string]bool{}
	for _, c := range probedContainers(pod) {
		seen[c.Name] = true
		cp := pp.containers[c.Name]
		if cp == nil {
			cp = &containerProbes{pod: pp}
			pp.containers[c.Name] = cp
		}
		cp.spec = c
		for k := range nKinds {
			p := probeOf(c, k)
			w := cp.workers[k]
			if w != nil && p != nil && reflect.DeepEqual(w.probe, p) {
				continue
			}
			if w != nil {
				w.cancel()
				cp.workers[k] = nil
			}
			if p != nil {
				cp.workers[k] = m.startWorker(cp, k, p)
			}
		}
	}
	for name, cp := range pp.containers {
		if !seen[name] {
			cp.stop()
			delete(pp.containers, name)
		}
	}
}

// probedContainers are the containers that may have probes: sidecars and
// app containers.
func probedContainers(pod *v1.Pod) []*v1.Container {
	var out []*v1.Container
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		if c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways {
			out = append(out, c)
		}
	}
	for i := range pod.Spec.Containers {
		out = append(out, &pod.Spec.Containers[i])
	}
	return out
}

func probeOf(c *v1.Container, k Kind) *v1.Probe {
	return [...]*v1.Probe{c.LivenessProbe, c.ReadinessProbe, c.StartupProbe}[k]
}

// startWorker starts a probe's worker. Like the kubelet's, it probes at
// once and then every period from now; only while noderun itself started
// less than a period ago (adopting all its pods at once) does the first
// probe wait a random part of the period, so probes spread out.
func (m *Manager) startWorker(cp *containerProbes, k Kind, p *v1.Probe) *worker {
	w := &worker{m: m, c: cp, kind: k, probe: p, trigger: make(chan struct{}, 1)}
	w.ctx, w.cancel = context.WithCancel(m.ctx)
	w.reset(cp.id)
	period := seconds(p.PeriodSeconds, 10)
	var first time.Duration
	if m.cfg.Clock.Now().Sub(m.cfg.Started) < period {
		first = time.Duration(m.cfg.Rand() * float64(period))
	}
	t := m.cfg.Clock.NewTimer(first) // here, so the phase is the pod's arrival
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		w.run(t, period)
	}()
	return w
}

func (w *worker) reset(id string) {
	w.id, w.result, w.lastResult, w.resultRun, w.onHold = id, w.kind.initial(), Unknown, 0, false
}

func (cp *containerProbes) stop() {
	for k, w := range cp.workers {
		if w != nil {
			w.cancel()
			cp.workers[k] = nil
		}
	}
}

// SetContainer tells the workers about the container's current run: id ""
// when it is not running. A new run starts from the initial results; one
// without a startup probe is started at once, so readiness probes now
// rather than at its next tick (as the kubelet's status update triggers it).
func (m *Manager) SetContainer(podUID types.UID, name, id string, startedAt time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	pp := m.pods[podUID]
	if pp == nil {
		return
	}
	cp := pp.containers[name]
	if cp == nil || cp.id == id {
		return
	}
	cp.id, cp.startedAt = id, startedAt
	for _, w := range cp.workers {
		if w != nil {
			w.reset(id)
		}
	}
	if id != "" && cp.workers[Startup] == nil {
		cp.triggerReadiness()
	}
}

func (cp *containerProbes) triggerReadiness() {
	if w := cp.workers[Readiness]; w != nil {
		select {
		case w.trigger <- struct{}{}:
		default:
		}
	}
}

// RemovePod stops the pod's workers.
func (m *Manager) RemovePod(podUID types.UID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if pp := m.pods[podUID]; pp != nil {
		for _, cp := range pp.containers {
			cp.stop()
		}
		delete(m.pods, podUID)
	}
}

// Stop ends every worker and waits for them.
func (m *Manager) Stop() {
	m.cancel()
	m.wg.Wait()
}

// Result is the probe's result for the run id; ok is false when the
// container has no such probe or the result is for another run.
func (m *Manager) Result(podUID types.UID, name string, k Kind, id string) (Result, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	w := m.worker(podUID, name, k)
	if w == nil || w.id != id {
		return Unknown, false
	}
	return w.result, true
}

// Started says whether a running run counts as started: it has no startup
// probe or that probe succeeded.
func (m *Manager) Started(podUID types.UID, name, id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.startedLocked(podUID, name, id)
}

func (m *Manager) startedLocked(podUID types.UID, name, id string) bool {
	w := m.worker(podUID, name, Startup)
	return w == nil || (w.id == id && w.result == Success)
}

// Ready says whether a running run is ready: started, and its readiness
// probe succeeded or it has none.
func (m *Manager) Ready(podUID types.UID, name, id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.startedLocked(podUID, name, id) {
		return false
	}
	w := m.worker(podUID, name, Readiness)
	return w == nil || (w.id == id && w.result == Success)
}

func (m *Manager) worker(podUID types.UID, name string, k Kind) *worker {
	if pp := m.pods[podUID]; pp != nil {
		if cp := pp.containers[name]; cp != nil {
			return cp.workers[k]
		}
	}
	return nil
}

func (w *worker) run(t Timer, period time.Duration) {
	defer t.Stop()
	for {
		select {
		case <-w.ctx.Done():
			return
		case <-t.C():
			t.Reset(period)
		case <-w.trigger:
		}
		w.probeOnce()
	}
}

// probeOnce is the kubelet worker's doProbe: nothing while the container
// is not running, held after a reported failure, not started (liveness and
// readiness) or already started (startup), or within initialDelaySeconds;
// otherwise one attempt, counted against the thresholds.
func (w *worker) probeOnce() {
	m := w.m
	m.mu.Lock()
	cp := w.c
	id, ip, spec := cp.id, cp.pod.ip, cp.spec
	skip := id == "" || w.id != id || w.onHold || w.ctx.Err() != nil ||
		(w.kind == Startup && w.result == Success) ||
		(w.kind != Startup && cp.workers[Startup] != nil && cp.workers[Startup].result != Success) ||
		m.cfg.Clock.Now().Sub(cp.startedAt) < time.Duration(w.probe.InitialDelaySeconds)*time.Second
	m.mu.Unlock()
	if skip {
		return
	}
	res, msg, err := Do(w.ctx, &w.probe.ProbeHandler, seconds(w.probe.TimeoutSeconds, 1), Target{PodIP: ip, ContainerID: id, Container: spec}, m.cfg.Exec)
	if err != nil || w.ctx.Err() != nil {
		return // the attempt could not be made: thrown away, as the kubelet does
	}
	m.mu.Lock()
	if w.id != id {
		m.mu.Unlock()
		return // a new run began meanwhile
	}
	if res == w.lastResult {
		w.resultRun++
	} else {
		w.lastResult, w.resultRun = res, 1
	}
	changed := false
	below := (res == Failure && w.resultRun < threshold(w.probe.FailureThreshold, 3)) ||
		(res == Success && w.resultRun < threshold(w.probe.SuccessThreshold, 1))
	if !below {
		changed = w.result != res
		w.result = res
		if w.kind != Readiness && res == Failure {
			// Reported; the container is killed, so stop until the next run.
			w.onHold, w.resultRun = true, 0
		}
		if w.kind == Startup && res == Success {
			cp.triggerReadiness()
		}
	}
	uid := string(cp.pod.uid)
	m.mu.Unlock()
	if res == Failure && m.cfg.OnProbeFailure != nil {
		m.cfg.OnProbeFailure(uid, spec.Name, w.kind, msg)
	}
	if changed {
		m.cfg.OnChange(uid)
	}
}

func seconds(n, def int32) time.Duration {
	if n <= 0 {
		n = def
	}
	return time.Duration(n) * time.Second
}

func threshold(n, def int32) int {
	if n <= 0 {
		return int(def)
	}
	return int(n)
}

type realClock struct{}

func (realClock) Now() time.Time                 { return time.Now() }
func (realClock) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ *time.Timer }

func (t realTimer) C() <-chan time.Time { return t.Timer.C }
