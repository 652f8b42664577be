package prober

import (
	"context"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/clock"
)

// maxTries is how often in a row an attempt that could not be made is
// tried again at once before the worker gives up until its next tick (the
// kubelet's maxProbeRetries).
const maxTries = 3

// worker runs one probe of one container on the kubelet's schedule: a
// probe when it starts, then every period from then on (a ticker), and a
// manual run that restarts the period. Its result fields are guarded by
// the manager's lock.
type worker struct {
	m      *Manager
	c      *containerProbes
	kind   Kind
	probe  *v1.Probe
	period time.Duration
	ctx    context.Context
	cancel context.CancelFunc
	timer  clock.Timer // the only wake-up: ticks and manual runs both fire it

	probed    bool // the first probe ran: a manual run may fire the timer
	triggered bool // a manual run is due

	id         string // the run the result is for
	result     Result
	lastResult Result
	resultRun  int  // attempts in a row that gave lastResult
	onHold     bool // a liveness failure or a startup result was reported for this run
}

func (m *Manager) startWorker(cp *containerProbes, k Kind, p *v1.Probe) *worker {
	w := &worker{m: m, c: cp, kind: k, probe: p, period: seconds(p.PeriodSeconds, 10),
		id: cp.id, result: k.initial()}
	w.ctx, w.cancel = context.WithCancel(m.ctx)
	w.timer = m.cfg.Clock.NewTimer(m.firstWait(w.period))
	m.wg.Add(1)
	go w.run()
	return w
}

// newRun starts a container run over: the initial result, probing again.
// lastResult and resultRun carry over, as in the kubelet's worker.
func (w *worker) newRun(id string) {
	w.id, w.result, w.onHold = id, w.kind.initial(), false
}

// trigger asks for a probe now, the kubelet's manualTriggerCh. Before the
// worker's first probe it is only noted (the kubelet's worker sleeps
// through its start-up jitter), so it runs right after that one.
func (w *worker) trigger() {
	w.triggered = true
	if w.probed {
		w.timer.Reset(0)
	}
}

func (w *worker) run() {
	defer w.m.wg.Done()
	defer w.timer.Stop()
	clock := w.m.cfg.Clock
	select {
	case <-w.ctx.Done():
		return
	case <-w.timer.C():
	}
	tick := clock.Now()
	for {
		w.doProbe()
		w.m.mu.Lock()
		w.probed = true
		wait, next := time.Duration(0), tick
		if !w.triggered {
			wait, next = nextTick(tick, clock.Now(), w.period)
		}
		w.timer.Reset(wait)
		w.m.mu.Unlock()
		select {
		case <-w.ctx.Done():
			return
		case <-w.timer.C():
		}
		w.m.mu.Lock()
		tick = next
		if w.triggered {
			// A manual run restarts the period from now.
			w.triggered, tick = false, clock.Now()
		}
		w.m.mu.Unlock()
	}
}

// nextTick is when a time.Ticker with ticks at last + k·period delivers
// its next tick to a receiver that is ready again at now: at the next
// tick, or at once if one came due meanwhile (the ticker keeps one and
// drops the rest, so its phase stays). at is the tick delivered.
func nextTick(last, now time.Time, period time.Duration) (wait time.Duration, at time.Time) {
	at = last.Add(period)
	if at.After(now) {
		return at.Sub(now), at
	}
	return 0, last.Add(now.Sub(last) / period * period)
}

// doProbe is the kubelet worker's doProbe: nothing while the container is
// not running, while held after a reported failure, within
// initialDelaySeconds of its start, before it started (liveness and
// readiness) or once it started (startup); otherwise one attempt, counted
// against the thresholds.
func (w *worker) doProbe() {
	m := w.m
	m.mu.Lock()
	cp := w.c
	id := cp.id
	// The kubelet compares whole seconds since the start.
	since := int64(m.cfg.Clock.Now().Sub(cp.startedAt) / time.Second)
	if w.ctx.Err() != nil || id == "" || w.id != id || w.onHold ||
		since < int64(w.probe.InitialDelaySeconds) || (w.kind == Startup) == cp.started(id) {
		m.mu.Unlock()
		return
	}
	t := Target{PodIP: cp.pod.ip, ContainerID: id, Container: cp.spec}
	uid := string(cp.pod.uid)
	m.mu.Unlock()

	var (
		res Result
		msg string
		err error
	)
	for range maxTries {
		res, msg, err = Do(w.ctx, &w.probe.ProbeHandler, seconds(w.probe.TimeoutSeconds, 1), t, m.cfg.Exec)
		if err == nil || w.ctx.Err() != nil {
			break
		}
	}
	if w.ctx.Err() == nil && m.cfg.OnResult != nil {
		if err != nil {
			res = Unknown
		}
		m.cfg.OnResult(uid, t.Container.Name, w.kind, res)
	}
	switch {
	case w.ctx.Err() != nil:
		return // stopped meanwhile: the attempt was cut short
	case err != nil:
		if m.cfg.OnProbeError != nil {
			m.cfg.OnProbeError(uid, t.Container.Name, w.kind, err)
		}
		return // thrown away, as the kubelet does
	case res == Failure && m.cfg.OnProbeFailure != nil:
		m.cfg.OnProbeFailure(uid, t.Container.Name, w.kind, msg)
	}
	m.mu.Lock()
	changed := w.id == id && w.record(res)
	m.mu.Unlock()
	if changed {
		m.cfg.OnChange(uid)
	}
}

// record counts an attempt's result against the thresholds and reports
// it once reached; it says whether the reported result changed.
func (w *worker) record(res Result) bool {
	if res == w.lastResult {
		w.resultRun++
	} else {
		w.lastResult, w.resultRun = res, 1
	}
	if (res == Failure && w.resultRun < threshold(w.probe.FailureThreshold, 3)) ||
		(res == Success && w.resultRun < threshold(w.probe.SuccessThreshold, 1)) {
		return false
	}
	changed := w.result != res
	w.result = res
	if (w.kind == Liveness && res == Failure) || w.kind == Startup {
		// The container is about to be killed, or has started: nothing to
		// probe until the next run.
		w.onHold, w.resultRun = true, 0
	}
	if w.kind == Startup && res == Success {
		w.c.triggerReadiness()
	}
	return changed
}

func seconds(n, def int32) time.Duration {
	if n <= 0 {
		n = def
	}
	return time.Duration(n) * time.Second
}

func threshold(n, def int32) int {
	if n <= 0 {
		n = def
	}
	return int(n)
}
