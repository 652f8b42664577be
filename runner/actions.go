package runner

import (
	"fmt"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
)

// podView is everything the lifecycle decision looks at: the spec, the
// newest run of each container as the runtime reports it, probe results and
// the time. It is the input of computePodActions, the one place that decides
// what a pod's containers should do next (the kubelet's computePodActions).
type podView struct {
	pod     *v1.Pod
	now     time.Time
	started time.Time // the pod's start time, for activeDeadlineSeconds
	// epoch names the pod's current sandbox; a run from another one ran in
	// namespaces that are gone, so init containers run again.
	epoch  string
	runs   map[string]*ContainerStatus // newest run by container name
	probes probeView
}

// probeView answers for one container run what its probes concluded.
type probeView interface {
	// failed names the probe ("liveness" or "startup") whose failure
	// crossed its threshold for this run, or is "".
	failed(name, id string) string
	// started: running, and the startup probe succeeded or there is none.
	started(name, id string) bool
	// ready: started, and the readiness probe succeeded or there is none.
	ready(name, id string) bool
}

// podActions is what the worker does next, in this order: stop kill, then
// start start (each subject to its crash backoff).
type podActions struct {
	kill  []killAction
	start []startAction
	// failed is set when the pod has ended for good without completing
	// normally: its reason ("DeadlineExceeded"); nothing starts again.
	failed   string
	initDone bool
	// deadline is when activeDeadlineSeconds runs out (zero: none), so the
	// worker wakes then even if nothing else happens.
	deadline time.Time
	// unknown: the runtime could not tell some container's state; nothing
	// was decided for it, and the worker looks again soon.
	unknown bool
	// resetAll: a container exited under a RestartAllContainers rule. kill
	// stops every running container at once; then every container is
	// removed, and the pod starts over from its first init container in
	// the same sandbox (its IP kept), as the kubelet v1.37 does.
	resetAll bool
}

// killAction stops one running container.
type killAction struct {
	c       *v1.Container
	init    bool
	run     *ContainerStatus
	message string        // why, for the Killing event
	grace   time.Duration // from the probe that failed, else the pod's
}

// startAction starts a container; prev is the run it replaces (nil for the
// first), whose exit decides the crash backoff.
type startAction struct {
	c    *v1.Container
	init bool
	prev *ContainerStatus
	// targetPID: an ephemeral container's target process, whose PID
	// namespace it joins.
	targetPID uint32
}

// Reasons a pod's phase ends in Failed without its containers failing.
const reasonDeadlineExceeded = "DeadlineExceeded"

// computePodActions decides, from v alone, which containers to stop and
// which to start: init containers one after another (sidecars stay running
// and must be started before the next one), then every app container, each
// restarted per restartPolicy, liveness and startup failures, a changed spec
// and a recreated sandbox, as the kubelet does.
func computePodActions(v podView) podActions {
	var a podActions
	spec := &v.pod.Spec
	if d := spec.ActiveDeadlineSeconds; d != nil && !v.started.IsZero() {
		a.deadline = v.started.Add(time.Duration(*d) * time.Second)
		if !v.now.Before(a.deadline) {
			var scratch podActions
			a.initDone = scratch.initActions(v) // for the Initialized condition only
			a.failed = reasonDeadlineExceeded
			a.killAll(v, "Pod was active on the node longer than the specified deadline")
			return a
		}
	}
	if v.restartAllTriggered() {
		var scratch podActions
		a.initDone = scratch.initActions(v) // for the Initialized condition only
		a.resetAll = true
		a.stopForReset(v)
		return a
	}
	a.initDone = a.initActions(v)
	if !a.initDone {
		return a
	}
	keep, starts := 0, 0
	for i := range spec.Containers {
		c := &spec.Containers[i]
		run := v.runs[c.Name]
		if run != nil && run.State == StateUnknown {
			// Cannot tell whether it runs: replacing it could kill a
			// healthy process, so only positive evidence acts.
			a.unknown = true
			keep++
			continue
		}
		if run == nil || run.State != StateRunning {
			if shouldStart(spec, c, run) {
				a.start = append(a.start, startAction{c: c, prev: run})
				starts++
			}
			continue
		}
		// Running: only restartPolicy decides whether a kill for a failed
		// probe restarts it; its rules need an exit code.
		restart := spec.RestartPolicy != v1.RestartPolicyNever
		if c.RestartPolicy != nil {
			restart = *c.RestartPolicy != v1.ContainerRestartPolicyNever
		}
		var msg string
		grace := podGrace(v.pod)
		switch probe := v.probes.failed(c.Name, run.ID); {
		case !v.current(run):
			msg, restart = fmt.Sprintf("Container %s is in a pod sandbox that is gone", c.Name), true
		case run.SpecHash != specHash(c):
			msg, restart = fmt.Sprintf("Container %s definition changed", c.Name), true
		case probe != "":
			msg, grace = fmt.Sprintf("Container %s failed %s probe", c.Name, probe), probeGrace(v.pod, c, probe)
		default:
			keep++
			continue
		}
		if restart {
			msg += ", will be restarted"
			a.start = append(a.start, startAction{c: c, prev: run})
			starts++
		}
		a.kill = append(a.kill, killAction{c: c, run: run, message: msg, grace: grace})
	}
	if keep == 0 && starts == 0 {
		// Every app container has ended for good: the pod is complete, and
		// its sidecars stop too (in reverse order, as at termination) and
		// are not restarted.
		a.killSidecars(v)
	}
	return a
}

// initActions walks the init containers in order and reports whether the
// pod is initialized. A regular init container must exit 0 before the next
// starts; a sidecar (restartPolicy Always) must be started, and keeps being
// restarted afterwards. Once an app container has run in this sandbox,
// only sidecars are looked after.
func (a *podActions) initActions(v podView) bool {
	spec := &v.pod.Spec
	// A pod whose app containers all ended for good is not initialized
	// again in a new sandbox (after a reboot): the kubelet makes no sandbox
	// when nothing is left to start.
	initialized := v.ended()
	for i := range spec.Containers {
		if run := v.runs[spec.Containers[i].Name]; run != nil && (v.current(run) || spec.RestartPolicy == v1.RestartPolicyNever) {
			// A Never pod is not initialized again: the kubelet does not
			// recreate the sandbox of a pod that will not restart.
			initialized = true
		}
	}
	for i := range spec.InitContainers {
		c := &spec.InitContainers[i]
		run := v.runs[c.Name]
		current := run != nil && v.current(run)
		if run != nil && run.State == StateUnknown {
			// Cannot tell, even for a run from a gone sandbox: it may
			// still run, so nothing starts beside it.
			a.unknown = true
			if !initialized {
				return false
			}
			continue
		}
		if isSidecar(c) {
			switch {
			case !current || run.State != StateRunning:
				a.start = append(a.start, startAction{c: c, init: true, prev: run})
				if !initialized {
					return false
				}
			default:
				a.checkSidecar(v, c, run)
				if !initialized && !v.probes.started(c.Name, run.ID) {
					return false
				}
			}
			continue
		}
		if initialized {
			continue
		}
		switch {
		case !current:
			a.start = append(a.start, startAction{c: c, init: true, prev: run})
			return false
		case run.State == StateRunning:
			return false
		case run.State == StateExited && run.ExitCode == 0:
			continue
		case run.State == StateExited && !shouldStart(spec, c, run):
			// A failed init container that is not restarted fails the
			// pod: stop its sidecars.
			a.killSidecars(v)
			return false
		default:
			a.start = append(a.start, startAction{c: c, init: true, prev: run})
			return false
		}
	}
	return true
}

// checkSidecar restarts a running sidecar whose spec changed or whose
// liveness or startup probe failed.
func (a *podActions) checkSidecar(v podView, c *v1.Container, run *ContainerStatus) {
	var msg string
	grace := podGrace(v.pod)
	if run.SpecHash != specHash(c) {
		msg = fmt.Sprintf("Init container %s definition changed", c.Name)
	} else if probe := v.probes.failed(c.Name, run.ID); probe != "" {
		msg, grace = fmt.Sprintf("Init container %s failed %s probe", c.Name, probe), probeGrace(v.pod, c, probe)
	} else {
		return
	}
	a.kill = append(a.kill, killAction{c: c, init: true, run: run, message: msg + ", will be restarted", grace: grace})
	a.start = append(a.start, startAction{c: c, init: true, prev: run})
}

// killAll stops every running container: app containers, then sidecars.
func (a *podActions) killAll(v podView, msg string) {
	for i := range v.pod.Spec.Containers {
		c := &v.pod.Spec.Containers[i]
		if run := v.runs[c.Name]; run != nil && run.State == StateRunning {
			a.kill = append(a.kill, killAction{c: c, run: run, message: msg, grace: podGrace(v.pod)})
		}
	}
	for i := range v.pod.Spec.InitContainers {
		c := &v.pod.Spec.InitContainers[i]
		if run := v.runs[c.Name]; run != nil && run.State == StateRunning && !isSidecar(c) {
			a.kill = append(a.kill, killAction{c: c, init: true, run: run, message: msg, grace: podGrace(v.pod)})
		}
	}
	a.killSidecars(v)
	a.start = nil
}

// restartAllTriggered is the kubelet's ShouldAllContainersRestart: some
// container's run in this sandbox exited with a code a
// RestartAllContainers rule of it matches.
func (v podView) restartAllTriggered() bool {
	for _, c := range allContainers(v.pod) {
		run := v.runs[c.Name]
		if run == nil || run.State != StateExited || !v.current(run) {
			continue
		}
		if r, ok := matchingRule(c, int32(run.ExitCode)); ok && r.Action == v1.ContainerRestartRuleActionRestartAllContainers {
			return true
		}
	}
	return false
}

// stopForReset kills every running container with no grace period (the
// kubelet's minimum of 2 s still holds) and no preStop hook, as the
// kubelet's RestartAllContainers does, app containers first.
func (a *podActions) stopForReset(v podView) {
	for _, c := range allContainers(v.pod) {
		run := v.runs[c.Name]
		if run == nil || (run.State != StateRunning && run.State != StateUnknown) {
			continue
		}
		a.kill = append(a.kill, killAction{c: c, init: isInit(v.pod, c.Name), run: run,
			message: fmt.Sprintf("Stopping container %s: the pod restarts all its containers", c.Name)})
	}
}

// killSidecars stops the running sidecars, last declared first.
func (a *podActions) killSidecars(v podView) {
	inits := v.pod.Spec.InitContainers
	for i := len(inits) - 1; i >= 0; i-- {
		c := &inits[i]
		if run := v.runs[c.Name]; isSidecar(c) && run != nil && run.State == StateRunning {
			a.kill = append(a.kill, killAction{c: c, init: true, run: run, message: "Stopping sidecar container " + c.Name, grace: podGrace(v.pod)})
		}
	}
	a.start = nil
}

// needsSandbox is the kubelet's computePodActions when the pod's sandbox is
// gone (after a reboot): it makes a new one unless nothing would run in
// it, that is when the pod's restartPolicy is Never and some container of
// it has run, or when every app container has ended for good.
func needsSandbox(v podView) bool {
	if v.pod.Spec.RestartPolicy == v1.RestartPolicyNever && len(v.runs) > 0 {
		return false
	}
	return !v.ended()
}

// current reports whether a run belongs to the pod's present sandbox; runs
// recorded before sandboxes had epochs count as current.
func (v podView) current(run *ContainerStatus) bool {
	return run.Sandbox == "" || run.Sandbox == v.epoch
}

// ended reports whether every app container has run and ended for good
// under its restart rules and policies.
func (v podView) ended() bool {
	spec := &v.pod.Spec
	if len(spec.Containers) == 0 {
		return false
	}
	for i := range spec.Containers {
		c := &spec.Containers[i]
		run := v.runs[c.Name]
		if run == nil || run.State != StateExited || shouldStart(spec, c, run) {
			return false
		}
	}
	return true
}

// shouldStart is the kubelet's ShouldContainerBeRestarted for a container
// that is not running: never run or never started always; after an exit
// per restartOnExit. A run in an unknown state is not restarted: it may
// still be running.
func shouldStart(spec *v1.PodSpec, c *v1.Container, run *ContainerStatus) bool {
	if run == nil || run.State == StateCreated {
		return true
	}
	if run.State == StateUnknown {
		return false
	}
	return restartOnExit(spec, c, int32(run.ExitCode))
}

// restartOnExit is the kubelet v1.37's ContainerShouldRestart (with
// ContainerRestartRules and RestartAllContainersOnContainerExits on, their
// defaults): a container's restartPolicyRules in order, the first that
// matches the exit code deciding; then the container's restartPolicy; then
// the pod's. Rules count only beside a container restartPolicy, which
// validation requires.
func restartOnExit(spec *v1.PodSpec, c *v1.Container, exitCode int32) bool {
	policy := spec.RestartPolicy
	if c.RestartPolicy != nil {
		if _, ok := matchingRule(c, exitCode); ok {
			return true // Restart and RestartAllContainers both start it again
		}
		policy = v1.RestartPolicy(*c.RestartPolicy)
	}
	switch policy {
	case v1.RestartPolicyNever:
		return false
	case v1.RestartPolicyOnFailure:
		return exitCode != 0
	}
	return true
}

// matchingRule is the kubelet's FindMatchingContainerRestartRule: the first
// rule whose exit codes match (In: listed, NotIn: not listed).
func matchingRule(c *v1.Container, exitCode int32) (v1.ContainerRestartRule, bool) {
	for _, r := range c.RestartPolicyRules {
		if r.ExitCodes == nil {
			continue
		}
		listed := slices.Contains(r.ExitCodes.Values, exitCode)
		switch r.ExitCodes.Operator {
		case v1.ContainerRestartRuleOnExitCodesOpIn:
			if listed {
				return r, true
			}
		case v1.ContainerRestartRuleOnExitCodesOpNotIn:
			if !listed {
				return r, true
			}
		}
	}
	return v1.ContainerRestartRule{}, false
}

// isSidecar tells a sidecar among init containers; an app container's
// restartPolicy Always only overrides the pod's.
func isSidecar(c *v1.Container) bool {
	return c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways
}

// podGrace is the pod's terminationGracePeriodSeconds (default 30 s).
func podGrace(pod *v1.Pod) time.Duration {
	if g := pod.Spec.TerminationGracePeriodSeconds; g != nil {
		return time.Duration(*g) * time.Second
	}
	return 30 * time.Second
}

// probeGrace is the grace period for a kill after a failed probe: the
// probe's own terminationGracePeriodSeconds when set, else the pod's.
func probeGrace(pod *v1.Pod, c *v1.Container, probe string) time.Duration {
	p := c.LivenessProbe
	if probe == probeStartup {
		p = c.StartupProbe
	}
	if p != nil && p.TerminationGracePeriodSeconds != nil {
		return time.Duration(*p.TerminationGracePeriodSeconds) * time.Second
	}
	return podGrace(pod)
}

// Probe names as the decision and events use them.
const (
	probeLiveness  = "liveness"
	probeReadiness = "readiness"
	probeStartup   = "startup"
)
