package runner

import (
	"slices"
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
	return out
}

func TestComputePodActions(t *testing.T) {
	always, onFailure, never := v1.RestartPolicyAlways, v1.RestartPolicyOnFailure, v1.RestartPolicyNever
	type tc struct {
		name   string
		pod    *v1.Pod
		runs   func(*v1.Pod) map[string]*ContainerStatus
		probes fakeProbes
		epoch  string
		want   string
	}
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
