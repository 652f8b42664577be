package runner

import (
	"context"
	"time"

	v1 "k8s.io/api/core/v1"
)

// What the kubelet v1.37 reports for containers RestartAllContainers
// removed (kubelet_pods.go): their waiting reason and lastState.
const (
	reasonRestartingAll  = "RestartingAllContainers"
	messageRestartingAll = "The container is removed because RestartAllContainers in place"
	// reasonRestartAllStarted is the AllContainersRestarting condition's
	// reason while the containers go (status/generate.go).
	reasonRestartAllStarted = "RestartAllContainersStarted"
)

// resetAll carries out a RestartAllContainers decision: the running
// containers are stopped (acts.kill), then every container of the pod is
// removed, the ones the rule fired on last (so that a failure halfway
// leaves the trigger for the next sync), and each is remembered with its
// next restart count, to be started again from the first init container
// in the same sandbox. It returns when to look again.
func (w *podWorker) resetAll(ctx context.Context, pod *v1.Pod, acts podActions, latest map[string]*ContainerStatus) time.Duration {
	if len(acts.kill) > 0 {
		w.killAll(ctx, pod, acts.kill)
		fresh, ok := w.observeAfterKill(ctx, pod)
		if !ok {
			return w.failDelay("reset")
		}
		clear(latest)
		for name, run := range fresh {
			latest[name] = run
		}
	}
	var sources []*v1.Container
	for _, c := range allContainers(pod) {
		run := latest[c.Name]
		switch {
		case run == nil:
			continue
		case run.State == StateRunning || run.State == StateUnknown:
			// The kill did not take: nothing is removed beside a live
			// process; the next sync tries again.
			return w.failDelay("reset")
		case isResetSource(c, run):
			sources = append(sources, c)
			continue
		}
		w.removeForReset(ctx, c, run, latest)
	}
	for _, c := range sources {
		w.removeForReset(ctx, c, latest[c.Name], latest)
	}
	delete(w.st.backoff, "reset")
	w.poke() // start again at once, as the kubelet requeues the pod
	return 0
}

// isResetSource: run's exit fired a RestartAllContainers rule of c.
func isResetSource(c *v1.Container, run *ContainerStatus) bool {
	r, ok := matchingRule(c, int32(run.ExitCode))
	return run.State == StateExited && ok && r.Action == v1.ContainerRestartRuleActionRestartAllContainers
}

// removeForReset removes one container's run and keeps what its next run
// reports: the restart count one higher, the kubelet's lastState.
func (w *podWorker) removeForReset(ctx context.Context, c *v1.Container, run *ContainerStatus, latest map[string]*ContainerStatus) {
	if w.st.reset == nil {
		w.st.reset = map[string]int{}
	}
	w.st.reset[c.Name] = run.RestartCount + 1
	w.st.waiting[c.Name] = waitReason{reasonRestartingAll, messageRestartingAll}
	delete(w.st.startErr, c.Name)
	delete(latest, c.Name)
	w.remove(ctx, run.ID)
}

// resetLastState is the lastState of a container RestartAllContainers
// removed, as the kubelet reports it.
func resetLastState() *v1.ContainerStateTerminated {
	return &v1.ContainerStateTerminated{Reason: reasonRestartingAll, Message: messageRestartingAll, ExitCode: 137}
}

// restartAllCondition is the kubelet's AllContainersRestarting condition,
// reported for pods with a RestartAllContainers rule: True while the
// containers are being stopped and removed.
func restartAllCondition(pod *v1.Pod, phase v1.PodPhase, resetting bool) (v1.PodCondition, bool) {
	if !allCouldRestart(pod) {
		return v1.PodCondition{}, false
	}
	c := v1.PodCondition{Type: v1.AllContainersRestarting, Status: v1.ConditionFalse}
	switch {
	case phase == v1.PodSucceeded:
		c.Reason = "PodCompleted"
	case phase == v1.PodFailed:
		c.Reason = "PodFailed"
	case resetting:
		c.Status, c.Reason, c.Message = v1.ConditionTrue, reasonRestartAllStarted, "container exited with restart policy rule"
	}
	return c, true
}

// allCouldRestart is the kubelet's AllContainersCouldRestart: some
// container has a RestartAllContainers rule.
func allCouldRestart(pod *v1.Pod) bool {
	for _, c := range allContainers(pod) {
		for _, r := range c.RestartPolicyRules {
			if r.Action == v1.ContainerRestartRuleActionRestartAllContainers {
				return true
			}
		}
	}
	return false
}
