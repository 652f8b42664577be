package prober

import (
	"context"
	"math/rand/v2"
	"reflect"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
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

// initial is a probe's result for a new run before it has concluded
// anything, as the kubelet sets it: alive, not ready, startup unknown.
func (k Kind) initial() Result {
	return [...]Result{Success, Failure, Unknown}[k]
}

// Config wires a Manager. Callbacks are called from worker goroutines and
// must not block.
type Config struct {
	Exec Execer // required for exec probes
	// OnChange is called when a container run's result changed.
	OnChange func(podUID string)
	// OnProbeFailure, if set, is called for every failed attempt, also
	// below the failure threshold: the kubelet's Unhealthy event
	// "<Kind> probe failed: <msg>".
	OnProbeFailure func(podUID, container string, kind Kind, msg string)
	// OnProbeError, if set, is called for an attempt that could not be
	// made (three tries in a row); its result is thrown away. The kubelet
	// records it as Unhealthy "<Kind> probe errored: <err>".
	OnProbeError func(podUID, container string, kind Kind, err error)
	// Clock is time for the workers, so tests can drive them; default
	// clock.RealClock. Its timers' Reset and Stop must discard a value not
	// yet received, as *time.Timer does since Go 1.23.
	Clock   clock.Clock
	Rand    func() float64 // in [0,1), for the spread of first probes; default math/rand/v2
	Started time.Time      // when noderun started; default: now

	// OnResult, if set, is called for every attempt with its result
	// (Unknown when it could not be made), for metrics.
	OnResult func(podUID, container string, kind Kind, res Result)
}

// Manager runs one worker per probe of every probed container of every pod
// and keeps each probe's result per container run.
type Manager struct {
	cfg    Config
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu   sync.Mutex // guards pods and the workers' result fields
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

// NewManager returns a manager; Stop ends its workers.
func NewManager(cfg Config) *Manager {
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
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
// stop for removed ones; a changed probe restarts its worker, from the
// initial result. Declaring the same pod object again costs a map lookup.
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
			p, w := probeOf(c, k), cp.workers[k]
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

// probedContainers are the containers the kubelet probes: app containers
// and sidecars (init containers with restartPolicy Always).
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

func (cp *containerProbes) stop() {
	for k, w := range cp.workers {
		if w != nil {
			w.cancel()
			cp.workers[k] = nil
		}
	}
}

// SetContainer tells the workers about the container's current run, id ""
// when it is not running. A new run starts from the initial results and
// un-holds the workers; one without a startup probe counts as started at
// once, so its readiness probe runs now rather than at its next tick (as
// the kubelet's status update triggers it). When the container stops, its
// last run's results stay as they were and nothing is probed.
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
	if id == "" {
		return
	}
	for _, w := range cp.workers {
		if w != nil {
			w.newRun(id)
		}
	}
	if cp.workers[Startup] == nil {
		cp.triggerReadiness()
	}
}

func (cp *containerProbes) triggerReadiness() {
	if w := cp.workers[Readiness]; w != nil {
		w.trigger()
	}
}

// started is the kubelet's Started for the run id: no startup probe, or
// it succeeded for that run.
func (cp *containerProbes) started(id string) bool {
	w := cp.workers[Startup]
	return w == nil || (w.id == id && w.result == Success)
}

// RemovePod stops the pod's workers and forgets its results.
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
	cp := m.container(podUID, name)
	if cp == nil || cp.workers[k] == nil || cp.workers[k].id != id {
		return Unknown, false
	}
	return cp.workers[k].result, true
}

// Started says whether a running run counts as started: it has no startup
// probe or that probe succeeded.
func (m *Manager) Started(podUID types.UID, name, id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	cp := m.container(podUID, name)
	return cp == nil || cp.started(id)
}

// Ready says whether a running run is ready: started, and its readiness
// probe succeeded or it has none.
func (m *Manager) Ready(podUID types.UID, name, id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	cp := m.container(podUID, name)
	if cp == nil {
		return true
	}
	w := cp.workers[Readiness]
	return cp.started(id) && (w == nil || (w.id == id && w.result == Success))
}

func (m *Manager) container(podUID types.UID, name string) *containerProbes {
	if pp := m.pods[podUID]; pp != nil {
		return pp.containers[name]
	}
	return nil
}

// firstWait is how long a new worker waits before its first probe. As the
// kubelet's, a worker started less than a period after noderun itself
// (adopting every pod at once) waits a random part of the period, so
// their probes spread out. Any other waits a random part of the smaller
// of a tenth of the period and a second: pods that arrive together then do
// not all probe in the same millisecond every period. That keeps every
// probe within a second of the kubelet's schedule, less than the kubelet's
// own spread between a worker's start (the pod's admission) and its
// container running, and a readiness schedule restarts when the container
// starts anyway.
func (m *Manager) firstWait(period time.Duration) time.Duration {
	if m.cfg.Clock.Now().Sub(m.cfg.Started) < period {
		return time.Duration(m.cfg.Rand() * float64(period))
	}
	return time.Duration(m.cfg.Rand() * float64(min(period/10, time.Second)))
}
