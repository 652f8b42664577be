package runner

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// shutdownPods are a regular pod with a preStop hook and a 30 s grace, a
// regular one of 3 s, and a critical one (by its class) of 60 s.
func shutdownPods() (regular, short, critical *v1.Pod) {
	regular = testPod("r", "r", v1.RestartPolicyAlways)
	regular.Spec.Containers[0].Lifecycle = &v1.Lifecycle{PreStop: &v1.LifecycleHandler{Exec: &v1.ExecAction{Command: []string{"drain"}}}}
	short = testPod("s", "s", v1.RestartPolicyAlways)
	three := int64(3)
	short.Spec.TerminationGracePeriodSeconds = &three
	critical = testPod("c", "c", v1.RestartPolicyAlways)
	critical.Spec.PriorityClassName = "system-cluster-critical"
	sixty := int64(60)
	critical.Spec.TerminationGracePeriodSeconds = &sixty
	return regular, short, critical
}

func (f *engineFixture) runningAll(t *testing.T, uids ...string) {
	t.Helper()
	for _, uid := range uids {
		waitFor(t, uid+" running", func() bool {
			p := f.status(uid)
			return p != nil && len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].State.Running != nil
		})
	}
}

// terminated reports whether the pod shows the kubelet's node shutdown
// status: Failed, Terminated, the message and DisruptionTarget.
func (f *engineFixture) terminated(uid string) bool {
	p := f.status(uid)
	if p == nil || p.Status.Phase != v1.PodFailed || p.Status.Reason != "Terminated" ||
		p.Status.Message != "Pod was terminated in response to imminent node shutdown." {
		return false
	}
	return slices.ContainsFunc(p.Status.Conditions, func(c v1.PodCondition) bool {
		return c.Type == v1.DisruptionTarget && c.Status == v1.ConditionTrue && c.Reason == "TerminationByKubelet"
	})
}

// Regular pods stop first, their preStop hooks and grace within the
// regular period (total less critical), then critical pods within the
// critical period; meanwhile the node is not Ready and rejects new pods;
// stopped pods stay stopped, also after a cancellation.
func TestEngineShutdownOrder(t *testing.T) {
	f := startEngine(t)
	regular, short, critical := shutdownPods()
	f.send(regular, short, critical)
	f.runningAll(t, "r", "s", "c")
	ids := map[string]string{}
	for _, c := range f.rt.started {
		ids[string(c.Pod.UID)] = c.ID
	}

	f.e.Shutdown(context.Background(), 20*time.Second, 10*time.Second)
	for _, uid := range []string{"r", "s", "c"} {
		if !f.terminated(uid) {
			t.Errorf("%s: status %+v, want the kubelet's node shutdown status", uid, f.status(uid).Status)
		}
	}
	calls := f.rt.callLog()
	pos := func(call string) int { return slices.Index(calls, call) }
	// The pods' own grace when shorter than the group's period, else the period.
	r, s, c := pos("stop "+ids["r"]+" 10s"), pos("stop "+ids["s"]+" 3s"), pos("stop "+ids["c"]+" 10s")
	if r < 0 || s < 0 || c < 0 || pos("exec "+ids["r"]+" drain") > r || c < r || c < s {
		t.Errorf("calls %q: want r's preStop, then r stopped with 10s and s with 3s, then c with 10s", calls)
	}
	if err := f.e.ShutdownStatus(); err == nil || err.Error() != "node is shutting down" {
		t.Errorf("ShutdownStatus() = %v, want node is shutting down", err)
	}
	if !f.hasEvent("NodeShutdown", "Shutdown manager detected shutdown event") {
		t.Errorf("no NodeShutdown event on the node: %+v", f.e.Events())
	}

	late := testPod("late", "late", v1.RestartPolicyAlways)
	f.send(regular, short, critical, late)
	f.wantRejected(t, "late", "NodeShutdown", "Pod was rejected as the node is shutting down.")

	f.e.CancelShutdown()
	if err := f.e.ShutdownStatus(); err != nil {
		t.Errorf("ShutdownStatus() after the cancellation = %v", err)
	}
	f.send(regular, short, critical, testPod("after", "after", v1.RestartPolicyAlways))
	f.runningAll(t, "after")
	if n := strings.Count(strings.Join(f.rt.callLog(), "\n"), "stop "); n != 3 || !f.terminated("r") || f.rt.startedCount() != 4 {
		t.Errorf("after the cancellation: %d stops, %d starts, r %+v; want the stopped pods left stopped", n, f.rt.startedCount(), f.status("r").Status)
	}
}

// Each group is waited for at most its period (on the engine's clock):
// regular pods that have not stopped by then do not hold critical ones up.
func TestEngineShutdownGroupPeriod(t *testing.T) {
	f := startEngine(t)
	regular, _, critical := shutdownPods()
	f.send(regular, critical)
	f.runningAll(t, "r", "c")
	f.waitLoop(t)
	gate := make(chan struct{})
	f.rt.stopGate = gate // every stop hangs until the gate opens
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.e.Shutdown(context.Background(), 30*time.Second, 10*time.Second)
	}()
	waitFor(t, "r ordered to stop", func() bool { return f.terminated("r") })
	waitFor(t, "the regular group's 20s wait", func() bool { return f.clock.timerIn(20 * time.Second) })
	if f.terminated("c") {
		t.Fatal("c was stopped before the regular group's period ended")
	}
	f.clock.Advance(20 * time.Second)
	waitFor(t, "c ordered to stop", func() bool { return f.terminated("c") })
	select {
	case <-done:
		t.Fatal("Shutdown returned while the critical pod was still stopping")
	default:
	}
	close(gate)
	<-done
}

func TestShutdownGroups(t *testing.T) {
	prio := func(uid string, class string, p *int32) *podWorker {
		pod := testPod(uid, uid, v1.RestartPolicyAlways)
		pod.Spec.PriorityClassName, pod.Spec.Priority = class, p
		return &podWorker{desired: pod}
	}
	i32 := func(v int32) *int32 { return &v }
	ws := []*podWorker{prio("none", "", nil), prio("neg", "", i32(-5)), prio("high", "", i32(1999999999)),
		prio("node", "system-node-critical", nil), prio("cluster", "system-cluster-critical", nil),
		prio("spec", "", i32(2000000000)), prio("spec-wins", "system-node-critical", i32(0)), prio("other-class", "high", nil)}
	g := shutdownPeriods{total: 30*time.Second + 500*time.Millisecond, critical: 10 * time.Second}.groups(ws)
	names := func(ws []*podWorker) (out []string) {
		for _, w := range ws {
			out = append(out, string(w.uid)+w.desired.Name)
		}
		return out
	}
	if got, want := names(g[0].pods), []string{"none-n1", "neg-n1", "high-n1", "spec-wins-n1", "other-class-n1"}; !slices.Equal(got, want) || g[0].period != 20*time.Second {
		t.Errorf("regular %v %s, want %v 20s", got, g[0].period, want)
	}
	if got, want := names(g[1].pods), []string{"node-n1", "cluster-n1", "spec-n1"}; !slices.Equal(got, want) || g[1].period != 10*time.Second {
		t.Errorf("critical %v %s, want %v 10s", got, g[1].period, want)
	}
}
