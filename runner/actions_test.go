package runner

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// fakeProbes answers probe questions from maps keyed by container name.
type fakeProbes struct {
	failedBy   map[string]string // name -> "liveness" / "startup"
	notStarted map[string]bool
	notReady   map[string]bool
}

func (p fakeProbes) failed(name, _ string) string        { return p.failedBy[name] }
func (p fakeProbes) started(name, _ string) bool         { return !p.notStarted[name] }
func (p fakeProbes) ready(name, _ string) bool           { return !p.notReady[name] && !p.notStarted[name] }
func (p fakeProbes) with(f func(*fakeProbes)) fakeProbes { f(&p); return p }

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// actionsPod has init containers "init" (regular) and "side" (sidecar)
// when asked, and app containers "a" and "b".
func actionsPod(policy v1.RestartPolicy, inits ...string) *v1.Pod {
	always := v1.ContainerRestartPolicyAlways
	pod := &v1.Pod{Spec: v1.PodSpec{RestartPolicy: policy,
		Containers: []v1.Container{{Name: "a", Image: "x"}, {Name: "b", Image: "x"}}}}
	for _, name := range inits {
		c := v1.Container{Name: name, Image: "x"}
		if strings.HasPrefix(name, "side") {
			c.RestartPolicy = &always
		}
		pod.Spec.InitContainers = append(pod.Spec.InitContainers, c)
	}
	return pod
}

// run builds a container run whose spec hash matches the pod's container.
func run(pod *v1.Pod, name string, state ContainerState, exit int) *ContainerStatus {
	c := specOf(pod, name)
	return &ContainerStatus{ID: name + "-id", Name: name, State: state, ExitCode: exit, SpecHash: specHash(c), Sandbox: "e1"}
}

func running(pod *v1.Pod, name string) *ContainerStatus { return run(pod, name, StateRunning, 0) }
func exited(pod *v1.Pod, name string, code int) *ContainerStatus {
	return run(pod, name, StateExited, code)
}

func runs(rs ...*ContainerStatus) map[string]*ContainerStatus {
	out := map[string]*ContainerStatus{}
	for _, r := range rs {
		out[r.Name] = r
	}
	return out
}

// summary renders actions as "kill:a,b start:c,d" for compact tables.
func summary(a podActions) string {
	var kills, starts []string
	for _, k := range a.kill {
		kills = append(kills, k.c.Name)
	}
	for _, s := range a.start {
		starts = append(starts, s.c.Name)
	}
	out := "kill:" + strings.Join(kills, ",") + " start:" + strings.Join(starts, ",")
	if a.failed != "" {
		out += " failed:" + a.failed
	}
	if !a.initDone {
		out += " init-pending"
	}
	if a.unknown {
		out += " unknown"
	}
	if a.resetAll {
		out += " reset"
	}
	return out
}

// actionsCase is one row of TestComputePodActions.
type actionsCase struct {
	name   string
	pod    *v1.Pod
	runs   func(*v1.Pod) map[string]*ContainerStatus
	probes fakeProbes
	epoch  string
	want   string
}

func TestComputePodActions(t *testing.T) {
	always, onFailure, never := v1.RestartPolicyAlways, v1.RestartPolicyOnFailure, v1.RestartPolicyNever
	type tc = actionsCase
	p := actionsPod
	cases := []tc{
		{name: "new pod starts every app container", pod: p(always),
			runs: func(*v1.Pod) map[string]*ContainerStatus { return nil },
			want: "kill: start:a,b"},
		{name: "running pod does nothing", pod: p(always),
			runs: func(p *v1.Pod) map[string]*ContainerStatus { return runs(running(p, "a"), running(p, "b")) },
			want: "kill: start:"},
		{name: "Always restarts a completed container", pod: p(always),
			runs: func(p *v1.Pod) map[string]*ContainerStatus { return runs(exited(p, "a", 0), running(p, "b")) },
			want: "kill: start:a"},
		{name: "OnFailure restarts only a failure", pod: p(onFailure),
			runs: func(p *v1.Pod) map[string]*ContainerStatus { return runs(exited(p, "a", 0), exited(p, "b", 2)) },
			want: "kill: start:b"},
		{name: "Never restarts nothing and the pod is complete", pod: p(never),
			runs: func(p *v1.Pod) map[string]*ContainerStatus { return runs(exited(p, "a", 0), exited(p, "b", 2)) },
			want: "kill: start:"},
		{name: "Never still starts a container that never ran", pod: p(never),
			runs: func(p *v1.Pod) map[string]*ContainerStatus { return runs(exited(p, "a", 0)) },
			want: "kill: start:b"},
		{name: "a created but never started run is started again, even under Never", pod: p(never),
			runs: func(p *v1.Pod) map[string]*ContainerStatus {
				return runs(run(p, "a", StateCreated, 0), running(p, "b"))
			},
			want: "kill: start:a"},
		{name: "liveness failure kills and restarts", pod: p(always),
			runs:   func(p *v1.Pod) map[string]*ContainerStatus { return runs(running(p, "a"), running(p, "b")) },
			probes: fakeProbes{failedBy: map[string]string{"a": probeLiveness}},
			want:   "kill:a start:a"},
		{name: "startup failure kills and restarts", pod: p(onFailure),
			runs:   func(p *v1.Pod) map[string]*ContainerStatus { return runs(running(p, "a"), running(p, "b")) },
			probes: fakeProbes{failedBy: map[string]string{"b": probeStartup}},
			want:   "kill:b start:b"},
		{name: "liveness failure under Never kills without restart", pod: p(never),
			runs:   func(p *v1.Pod) map[string]*ContainerStatus { return runs(running(p, "a"), exited(p, "b", 0)) },
			probes: fakeProbes{failedBy: map[string]string{"a": probeLiveness}},
			want:   "kill:a start:"},
		{name: "changed spec replaces the container", pod: p(never),
			runs: func(p *v1.Pod) map[string]*ContainerStatus {
				a := running(p, "a")
				a.SpecHash = "old"
				return runs(a, running(p, "b"))
			},
			want: "kill:a start:a"},
		{name: "readiness failure changes nothing", pod: p(always),
			runs:   func(p *v1.Pod) map[string]*ContainerStatus { return runs(running(p, "a"), running(p, "b")) },
			probes: fakeProbes{notReady: map[string]bool{"a": true}},
			want:   "kill: start:"},
		// Init containers.
		{name: "first init container starts alone", pod: p(always, "init", "init2"),
			runs: func(*v1.Pod) map[string]*ContainerStatus { return nil },
			want: "kill: start:init init-pending"},
		{name: "running init container is waited for", pod: p(always, "init", "init2"),
			runs: func(p *v1.Pod) map[string]*ContainerStatus { return runs(running(p, "init")) },
			want: "kill: start: init-pending"},
		{name: "next init container after success", pod: p(always, "init", "init2"),
			runs: func(p *v1.Pod) map[string]*ContainerStatus { return runs(exited(p, "init", 0)) },
			want: "kill: start:init2 init-pending"},
		{name: "failed init container is restarted", pod: p(onFailure, "init", "init2"),
			runs: func(p *v1.Pod) map[string]*ContainerStatus { return runs(exited(p, "init", 1)) },
			want: "kill: start:init init-pending"},
		{name: "failed init container fails a Never pod", pod: p(never, "init"),
			runs: func(p *v1.Pod) map[string]*ContainerStatus { return runs(exited(p, "init", 1)) },
			want: "kill: start: init-pending"},
		{name: "app containers after all init containers", pod: p(always, "init", "init2"),
			runs: func(p *v1.Pod) map[string]*ContainerStatus { return runs(exited(p, "init", 0), exited(p, "init2", 0)) },
			want: "kill: start:a,b"},
		{name: "init containers are not rerun once app containers ran", pod: p(always, "init"),
			runs: func(p *v1.Pod) map[string]*ContainerStatus { return runs(running(p, "a"), exited(p, "b", 1)) },
			want: "kill: start:b"},
		// A recreated sandbox (epoch e2): init containers run again.
		{name: "new sandbox reruns init containers", pod: p(always, "init"), epoch: "e2",
			runs: func(p *v1.Pod) map[string]*ContainerStatus {
				return runs(exited(p, "init", 0), exited(p, "a", 137), exited(p, "b", 137))
			},
			want: "kill: start:init init-pending"},
		{name: "new sandbox: Never pod that ran is not initialized again", pod: p(never, "init"), epoch: "e2",
			runs: func(p *v1.Pod) map[string]*ContainerStatus {
				return runs(exited(p, "init", 0), exited(p, "a", 0), exited(p, "b", 0))
			},
			want: "kill: start:"},
		{name: "a run left in a gone sandbox is replaced", pod: p(always), epoch: "e2",
			runs: func(p *v1.Pod) map[string]*ContainerStatus { return runs(running(p, "a"), exited(p, "b", 0)) },
			want: "kill:a start:a,b"},
		{name: "runs without an epoch count as current", pod: p(always, "init"), epoch: "e2",
			runs: func(p *v1.Pod) map[string]*ContainerStatus {
				i, a, b := exited(p, "init", 0), running(p, "a"), running(p, "b")
				i.Sandbox, a.Sandbox, b.Sandbox = "", "", ""
				return runs(i, a, b)
			},
			want: "kill: start:"},
		// Sidecars.
		{name: "sidecar starts first", pod: p(always, "side", "init"),
			runs: func(*v1.Pod) map[string]*ContainerStatus { return nil },
			want: "kill: start:side init-pending"},
		{name: "next init container once the sidecar is started", pod: p(always, "side", "init"),
			runs: func(p *v1.Pod) map[string]*ContainerStatus { return runs(running(p, "side")) },
			want: "kill: start:init init-pending"},
		{name: "sidecar not started (startup probe) holds the next", pod: p(always, "side", "init"),
			runs:   func(p *v1.Pod) map[string]*ContainerStatus { return runs(running(p, "side")) },
			probes: fakeProbes{notStarted: map[string]bool{"side": true}},
			want:   "kill: start: init-pending"},
		{name: "app containers start while the sidecar runs", pod: p(always, "side", "init"),
			runs: func(p *v1.Pod) map[string]*ContainerStatus { return runs(running(p, "side"), exited(p, "init", 0)) },
			want: "kill: start:a,b"},
		{name: "exited sidecar is restarted whatever the pod's policy", pod: p(never, "side"),
			runs: func(p *v1.Pod) map[string]*ContainerStatus {
				return runs(exited(p, "side", 0), running(p, "a"), running(p, "b"))
			},
			want: "kill: start:side"},
		{name: "sidecar liveness failure restarts it", pod: p(never, "side"),
			runs: func(p *v1.Pod) map[string]*ContainerStatus {
				return runs(running(p, "side"), running(p, "a"), running(p, "b"))
			},
			probes: fakeProbes{failedBy: map[string]string{"side": probeLiveness}},
			want:   "kill:side start:side"},
		{name: "completed pod stops its sidecars, last declared first", pod: p(never, "side1", "side2"),
			runs: func(p *v1.Pod) map[string]*ContainerStatus {
				return runs(running(p, "side1"), running(p, "side2"), exited(p, "a", 0), exited(p, "b", 1))
			},
			want: "kill:side2,side1 start:"},
		{name: "completed pod does not restart an exited sidecar", pod: p(onFailure, "side"),
			runs: func(p *v1.Pod) map[string]*ContainerStatus {
				return runs(exited(p, "side", 137), exited(p, "a", 0), exited(p, "b", 0))
			},
			want: "kill: start:"},
		{name: "a run in an unknown state is left alone, not replaced", pod: p(always),
			runs: func(p *v1.Pod) map[string]*ContainerStatus {
				return runs(run(p, "a", StateUnknown, 0), exited(p, "b", 1))
			},
			want: "kill: start:b unknown"},
		{name: "an unknown run keeps a pod from counting as complete", pod: p(never, "side"),
			runs: func(p *v1.Pod) map[string]*ContainerStatus {
				return runs(running(p, "side"), run(p, "a", StateUnknown, 0), exited(p, "b", 0))
			},
			want: "kill: start: unknown"},
		{name: "an init container in an unknown state holds the pod, unreplaced", pod: p(always, "init"),
			runs: func(p *v1.Pod) map[string]*ContainerStatus { return runs(run(p, "init", StateUnknown, 0)) },
			want: "kill: start: init-pending unknown"},
		{name: "a sidecar in an unknown state is not restarted", pod: p(always, "side"),
			runs: func(p *v1.Pod) map[string]*ContainerStatus {
				return runs(run(p, "side", StateUnknown, 0), running(p, "a"), running(p, "b"))
			},
			want: "kill: start: unknown"},
		{name: "an unknown init run from a gone sandbox holds the pod, nothing starts beside it", pod: p(always, "init"),
			runs:  func(p *v1.Pod) map[string]*ContainerStatus { return runs(run(p, "init", StateUnknown, 0)) },
			epoch: "e2", want: "kill: start: init-pending unknown"},
		{name: "an unknown sidecar from a gone sandbox is not started again; nothing acts until it is known", pod: p(always, "side"),
			runs: func(p *v1.Pod) map[string]*ContainerStatus {
				return runs(run(p, "side", StateUnknown, 0), running(p, "a"), running(p, "b"))
			},
			epoch: "e2", want: "kill: start: init-pending unknown"},
		{name: "OnFailure pod that completed is not initialized again in a new sandbox", pod: p(onFailure, "init"),
			runs: func(p *v1.Pod) map[string]*ContainerStatus {
				return runs(exited(p, "init", 0), exited(p, "a", 0), exited(p, "b", 0))
			},
			epoch: "e2", want: "kill: start:"},
		{name: "OnFailure pod with a failure reruns init, then only the failed one", pod: p(onFailure, "init"),
			runs: func(p *v1.Pod) map[string]*ContainerStatus {
				return runs(exited(p, "init", 0), exited(p, "a", 0), exited(p, "b", 255))
			},
			epoch: "e2", want: "kill: start:init init-pending"},
		{name: "failed init container of a Never pod stops the sidecars", pod: p(never, "side", "init"),
			runs: func(p *v1.Pod) map[string]*ContainerStatus { return runs(running(p, "side"), exited(p, "init", 3)) },
			want: "kill:side start: init-pending"},
	}
	cases = append(cases, restartRuleCases()...)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			epoch := c.epoch
			if epoch == "" {
				epoch = "e1"
			}
			got := summary(computePodActions(podView{pod: c.pod, now: t0, epoch: epoch, runs: c.runs(c.pod), probes: c.probes}))
			if got != c.want {
				t.Errorf("got %q, want %q", got, c.want)
			}
		})
	}
}

func TestComputePodActionsDeadline(t *testing.T) {
	pod := actionsPod(v1.RestartPolicyAlways, "side")
	d := int64(30)
	pod.Spec.ActiveDeadlineSeconds = &d
	rs := runs(running(pod, "side"), running(pod, "a"), exited(pod, "b", 1))
	before := computePodActions(podView{pod: pod, now: t0.Add(29 * time.Second), started: t0, epoch: "e1", runs: rs, probes: fakeProbes{}})
	if got := summary(before); got != "kill: start:b" {
		t.Errorf("before the deadline: %q", got)
	}
	if !before.deadline.Equal(t0.Add(30 * time.Second)) {
		t.Errorf("deadline %v, want start+30s", before.deadline)
	}
	after := computePodActions(podView{pod: pod, now: t0.Add(30 * time.Second), started: t0, epoch: "e1", runs: rs, probes: fakeProbes{}})
	if got := summary(after); got != "kill:a,side start: failed:DeadlineExceeded" {
		t.Errorf("at the deadline: %q", got)
	}
}

func TestKillGrace(t *testing.T) {
	pod := actionsPod(v1.RestartPolicyAlways)
	g, pg := int64(7), int64(3)
	pod.Spec.TerminationGracePeriodSeconds = &g
	pod.Spec.Containers[0].LivenessProbe = &v1.Probe{TerminationGracePeriodSeconds: &pg}
	rs := runs(running(pod, "a"), running(pod, "b"))
	acts := computePodActions(podView{pod: pod, now: t0, epoch: "e1", runs: rs,
		probes: fakeProbes{failedBy: map[string]string{"a": probeLiveness, "b": probeStartup}}})
	graces := map[string]time.Duration{}
	for _, k := range acts.kill {
		graces[k.c.Name] = k.grace
		if !strings.Contains(k.message, "probe, will be restarted") {
			t.Errorf("kill message %q", k.message)
		}
	}
	// a's liveness probe has its own grace period; b's startup probe has none.
	if graces["a"] != 3*time.Second || graces["b"] != 7*time.Second {
		t.Errorf("graces %v, want a=3s b=7s", graces)
	}
	if !slices.ContainsFunc(acts.start, func(s startAction) bool { return s.c.Name == "a" && s.prev == rs["a"] }) {
		t.Errorf("a is not restarted after its previous run: %+v", acts.start)
	}
}

// withRules gives container name of pod the restartPolicy and rules, in
// the manifest's short form: "Restart In 42,43", "Restart NotIn 0".
func withRules(pod *v1.Pod, name string, policy v1.ContainerRestartPolicy, rules ...string) *v1.Pod {
	c := specOf(pod, name)
	c.RestartPolicy = &policy
	for _, r := range rules {
		f := strings.Fields(r)
		var codes []int32
		for _, n := range strings.Split(f[2], ",") {
			code, _ := strconv.Atoi(n)
			codes = append(codes, int32(code))
		}
		c.RestartPolicyRules = append(c.RestartPolicyRules, v1.ContainerRestartRule{Action: v1.ContainerRestartRuleAction(f[0]),
			ExitCodes: &v1.ContainerRestartRuleOnExitCodes{Operator: v1.ContainerRestartRuleOnExitCodesOperator(f[1]), Values: codes}})
	}
	return pod
}

// restartRuleCases are the kubelet v1.37's container restart rules
// (KEP-5307): a container's restartPolicy over the pod's, its rules over both.
func restartRuleCases() []actionsCase {
	always, onFailure, never := v1.RestartPolicyAlways, v1.RestartPolicyOnFailure, v1.RestartPolicyNever
	cAlways, cOnFailure, cNever := v1.ContainerRestartPolicyAlways, v1.ContainerRestartPolicyOnFailure, v1.ContainerRestartPolicyNever
	p := actionsPod
	return []actionsCase{
		{name: "rules: container Never in an Always pod is not restarted", pod: withRules(p(always), "a", cNever),
			runs: func(p *v1.Pod) map[string]*ContainerStatus { return runs(exited(p, "a", 1), running(p, "b")) },
			want: "kill: start:"},
		{name: "rules: container Always in a Never pod is restarted", pod: withRules(p(never), "a", cAlways),
			runs: func(p *v1.Pod) map[string]*ContainerStatus { return runs(exited(p, "a", 0), exited(p, "b", 0)) },
			want: "kill: start:a"},
		{name: "rules: container OnFailure in an Always pod: success is final", pod: withRules(p(always), "a", cOnFailure),
			runs: func(p *v1.Pod) map[string]*ContainerStatus { return runs(exited(p, "a", 0), exited(p, "b", 0)) },
			want: "kill: start:b"},
		{name: "rules: container OnFailure in a Never pod: failure restarts", pod: withRules(p(never), "a", cOnFailure),
			runs: func(p *v1.Pod) map[string]*ContainerStatus { return runs(exited(p, "a", 2), exited(p, "b", 2)) },
			want: "kill: start:a"},
		{name: "rules: In matches: Restart overrides Never", pod: withRules(p(never), "a", cNever, "Restart In 42,43"),
			runs: func(p *v1.Pod) map[string]*ContainerStatus { return runs(exited(p, "a", 43), running(p, "b")) },
			want: "kill: start:a"},
		{name: "rules: In does not match: Never decides", pod: withRules(p(always), "a", cNever, "Restart In 42"),
			runs: func(p *v1.Pod) map[string]*ContainerStatus { return runs(exited(p, "a", 1), running(p, "b")) },
			want: "kill: start:"},
		{name: "rules: NotIn matches an unlisted code", pod: withRules(p(never), "a", cNever, "Restart NotIn 0"),
			runs: func(p *v1.Pod) map[string]*ContainerStatus { return runs(exited(p, "a", 7), running(p, "b")) },
			want: "kill: start:a"},
		{name: "rules: NotIn does not match a listed code", pod: withRules(p(never), "a", cNever, "Restart NotIn 0"),
			runs: func(p *v1.Pod) map[string]*ContainerStatus { return runs(exited(p, "a", 0), running(p, "b")) },
			want: "kill: start:"},
		{name: "rules: the first matching rule decides, in order", pod: withRules(p(never), "a", cNever, "Restart In 5", "Restart NotIn 5"),
			runs: func(p *v1.Pod) map[string]*ContainerStatus { return runs(exited(p, "a", 9), running(p, "b")) },
			want: "kill: start:a"},
		{name: "rules: a pod whose Never containers ended is complete, sidecars stop", pod: withRules(withRules(p(always, "side"), "a", cNever), "b", cNever),
			runs: func(p *v1.Pod) map[string]*ContainerStatus {
				return runs(running(p, "side"), exited(p, "a", 0), exited(p, "b", 3))
			},
			want: "kill:side start:"},
		{name: "rules: liveness failure of a container Never kills without restart", pod: withRules(p(always), "a", cNever, "Restart In 137"),
			runs:   func(p *v1.Pod) map[string]*ContainerStatus { return runs(running(p, "a"), running(p, "b")) },
			probes: fakeProbes{failedBy: map[string]string{"a": probeLiveness}},
			want:   "kill:a start:"},
		{name: "rules: liveness failure of a container Always in a Never pod restarts it", pod: withRules(p(never), "a", cAlways),
			runs:   func(p *v1.Pod) map[string]*ContainerStatus { return runs(running(p, "a"), running(p, "b")) },
			probes: fakeProbes{failedBy: map[string]string{"a": probeLiveness}},
			want:   "kill:a start:a"},
		{name: "rules: init container OnFailure in a Never pod is restarted after a failure", pod: withRules(p(never, "init"), "init", cOnFailure),
			runs: func(p *v1.Pod) map[string]*ContainerStatus { return runs(exited(p, "init", 1)) },
			want: "kill: start:init init-pending"},
		{name: "rules: init container Never in an Always pod fails the pod", pod: withRules(p(always, "side", "init"), "init", cNever),
			runs: func(p *v1.Pod) map[string]*ContainerStatus { return runs(running(p, "side"), exited(p, "init", 1)) },
			want: "kill:side start: init-pending"},
		{name: "rules: init container rule In restarts it in a Never pod", pod: withRules(p(never, "init"), "init", cNever, "Restart In 75"),
			runs: func(p *v1.Pod) map[string]*ContainerStatus { return runs(exited(p, "init", 75)) },
			want: "kill: start:init init-pending"},
		{name: "rules: onFailure pod, container Never, failure is final", pod: withRules(p(onFailure), "a", cNever),
			runs: func(p *v1.Pod) map[string]*ContainerStatus { return runs(exited(p, "a", 1), exited(p, "b", 1)) },
			want: "kill: start:b"},
		// RestartAllContainers (KEP-5532): every container stopped, the
		// pod starts over in its sandbox.
		{name: "rules: RestartAllContainers stops every running container", pod: withRules(p(always, "side", "init"), "a", cNever, "RestartAllContainers In 9"),
			runs: func(p *v1.Pod) map[string]*ContainerStatus {
				return runs(running(p, "side"), exited(p, "init", 0), exited(p, "a", 9), running(p, "b"))
			},
			want: "kill:side,b start: reset"},
		{name: "rules: RestartAllContainers with nothing running still resets", pod: withRules(p(never, "init"), "a", cNever, "RestartAllContainers NotIn 0"),
			runs: func(p *v1.Pod) map[string]*ContainerStatus {
				return runs(exited(p, "init", 0), exited(p, "a", 1), exited(p, "b", 0))
			},
			want: "kill: start: reset"},
		{name: "rules: RestartAllContainers on an init container's exit", pod: withRules(p(never, "init"), "init", cNever, "RestartAllContainers In 3"),
			runs: func(p *v1.Pod) map[string]*ContainerStatus { return runs(exited(p, "init", 3)) },
			want: "kill: start: init-pending reset"},
		{name: "rules: RestartAllContainers rule not matching: the policy decides", pod: withRules(p(always), "a", cNever, "RestartAllContainers In 9"),
			runs: func(p *v1.Pod) map[string]*ContainerStatus { return runs(exited(p, "a", 8), running(p, "b")) },
			want: "kill: start:"},
		{name: "rules: RestartAllContainers: a run from a gone sandbox does not fire", pod: withRules(p(always), "a", cNever, "RestartAllContainers In 9"),
			runs:  func(p *v1.Pod) map[string]*ContainerStatus { return runs(exited(p, "a", 9), exited(p, "b", 137)) },
			epoch: "e2", want: "kill: start:a,b"},
	}
}

func TestRestartOnExit(t *testing.T) {
	cNever, cOnFailure := v1.ContainerRestartPolicyNever, v1.ContainerRestartPolicyOnFailure
	for _, tc := range []struct {
		name   string
		pod    v1.RestartPolicy
		policy *v1.ContainerRestartPolicy
		rules  []string
		exit   int32
		want   bool
	}{
		{"pod Always", v1.RestartPolicyAlways, nil, nil, 0, true},
		{"pod OnFailure, success", v1.RestartPolicyOnFailure, nil, nil, 0, false},
		{"pod OnFailure, failure", v1.RestartPolicyOnFailure, nil, nil, 1, true},
		{"pod Never", v1.RestartPolicyNever, nil, nil, 1, false},
		{"container Never over Always", v1.RestartPolicyAlways, &cNever, nil, 1, false},
		{"container OnFailure over Never, failure", v1.RestartPolicyNever, &cOnFailure, nil, 1, true},
		{"container OnFailure over Always, success", v1.RestartPolicyAlways, &cOnFailure, nil, 0, false},
		{"Restart In matches", v1.RestartPolicyNever, &cNever, []string{"Restart In 1,2"}, 2, true},
		{"Restart In misses", v1.RestartPolicyNever, &cNever, []string{"Restart In 1,2"}, 3, false},
		{"Restart NotIn matches", v1.RestartPolicyNever, &cNever, []string{"Restart NotIn 0"}, 3, true},
		{"Restart NotIn misses", v1.RestartPolicyNever, &cNever, []string{"Restart NotIn 0"}, 0, false},
		{"RestartAllContainers restarts it too", v1.RestartPolicyNever, &cNever, []string{"RestartAllContainers In 9"}, 9, true},
		{"no rule matches: OnFailure decides", v1.RestartPolicyNever, &cOnFailure, []string{"Restart In 9"}, 0, false},
	} {
		pod := &v1.Pod{Spec: v1.PodSpec{RestartPolicy: tc.pod, Containers: []v1.Container{{Name: "a"}}}}
		if tc.policy != nil {
			withRules(pod, "a", *tc.policy, tc.rules...)
		}
		if got := restartOnExit(&pod.Spec, &pod.Spec.Containers[0], tc.exit); got != tc.want {
			t.Errorf("%s: restart %v, want %v", tc.name, got, tc.want)
		}
	}
}

// When a pod's sandbox is gone, a new one is made only if something would
// run in it, as the kubelet's computePodActions decides CreateSandbox.
func TestNeedsSandbox(t *testing.T) {
	tests := []struct {
		name   string
		policy v1.RestartPolicy
		inits  []string
		runs   func(*v1.Pod) map[string]*ContainerStatus
		want   bool
	}{
		{"never run", v1.RestartPolicyNever, nil, func(*v1.Pod) map[string]*ContainerStatus { return nil }, true},
		{"Never, ended", v1.RestartPolicyNever, nil,
			func(p *v1.Pod) map[string]*ContainerStatus { return runs(exited(p, "a", 0), exited(p, "b", 1)) }, false},
		{"Never, only an init container ran", v1.RestartPolicyNever, []string{"init"},
			func(p *v1.Pod) map[string]*ContainerStatus { return runs(exited(p, "init", 0)) }, false},
		{"OnFailure, all succeeded", v1.RestartPolicyOnFailure, []string{"init"},
			func(p *v1.Pod) map[string]*ContainerStatus {
				return runs(exited(p, "init", 0), exited(p, "a", 0), exited(p, "b", 0))
			}, false},
		{"OnFailure, one cut off", v1.RestartPolicyOnFailure, nil,
			func(p *v1.Pod) map[string]*ContainerStatus { return runs(exited(p, "a", 0), exited(p, "b", 255)) }, true},
		{"OnFailure, init done, app never ran", v1.RestartPolicyOnFailure, []string{"init"},
			func(p *v1.Pod) map[string]*ContainerStatus { return runs(exited(p, "init", 0)) }, true},
		{"Always, all succeeded", v1.RestartPolicyAlways, nil,
			func(p *v1.Pod) map[string]*ContainerStatus { return runs(exited(p, "a", 0), exited(p, "b", 0)) }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := actionsPod(tt.policy, tt.inits...)
			v := podView{pod: pod, now: t0, runs: tt.runs(pod), probes: fakeProbes{}}
			if got := needsSandbox(v); got != tt.want {
				t.Errorf("needsSandbox = %v, want %v", got, tt.want)
			}
		})
	}
}
