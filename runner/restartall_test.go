package runner

import (
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// TestEngineRestartAllContainers: an exit a RestartAllContainers rule
// matches stops the running containers with no grace (the kubelet's 2 s
// least), removes every container, the one whose exit fired the rule last,
// and starts the pod over from its init container, each container's
// restart count one up and its lastState RestartingAllContainers, with no
// crash backoff; AllContainersRestarting is False once it is done.
func TestEngineRestartAllContainers(t *testing.T) {
	f := startEngine(t)
	pod := withRules(testPod("u1", "web", v1.RestartPolicyNever), "main", v1.ContainerRestartPolicyNever, "RestartAllContainers In 9")
	pod.Spec.InitContainers = []v1.Container{{Name: "init", Image: "busybox:1.36"}}
	pod.Spec.Containers = append(pod.Spec.Containers, v1.Container{Name: "side", Image: "busybox:1.36"})
	f.send(pod)
	waitFor(t, "init started", func() bool { return f.rt.startedCount() == 1 })
	initID := f.rt.started[0].ID
	f.rt.exit(initID, 0)
	waitFor(t, "app containers started", func() bool { return f.rt.startedCount() == 3 })
	byName := map[string]string{}
	for _, c := range f.rt.started[1:] {
		byName[c.Container.Name] = c.ID
	}
	f.rt.exit(byName["main"], 9)
	waitFor(t, "init started again", func() bool { return f.rt.startedCount() == 4 })
	if got := f.rt.started[3]; got.Container.Name != "init" || got.RestartCount != 1 || got.LastState == nil || got.LastState.Reason != "RestartingAllContainers" || got.LastState.ExitCode != 137 {
		t.Fatalf("restarted %s, restart %d, lastState %+v; want init, 1, RestartingAllContainers 137", got.Container.Name, got.RestartCount, got.LastState)
	}
	f.rt.mu.Lock()
	removed, calls := slices.Clone(f.rt.removed), slices.Clone(f.rt.calls)
	f.rt.mu.Unlock()
	if len(removed) != 3 || removed[2] != byName["main"] || !slices.Contains(removed, initID) || !slices.Contains(removed, byName["side"]) {
		t.Errorf("removed %v; want init, side, then main (the one that fired the rule) last", removed)
	}
	if !slices.Contains(calls, "stop "+byName["side"]+" 2s") {
		t.Errorf("calls %v; want side stopped with the kubelet's least grace, 2s", calls)
	}
	f.rt.exit(f.rt.started[3].ID, 0)
	waitFor(t, "app containers started again", func() bool { return f.rt.startedCount() == 6 })
	waitFor(t, "status after the restart", func() bool {
		p := f.status("u1")
		if p == nil || p.Status.Phase != v1.PodRunning {
			return false
		}
		for _, cs := range p.Status.ContainerStatuses {
			if cs.RestartCount != 1 || cs.State.Running == nil {
				return false
			}
		}
		return true
	})
	p := f.status("u1")
	i := slices.IndexFunc(p.Status.Conditions, func(c v1.PodCondition) bool { return c.Type == v1.AllContainersRestarting })
	if i < 0 || p.Status.Conditions[i].Status != v1.ConditionFalse {
		t.Errorf("conditions %+v; want AllContainersRestarting False", p.Status.Conditions)
	}
}
