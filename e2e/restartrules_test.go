package e2e

import (
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// runsThenExits is a shell script for a container that counts its runs in
// the pod's emptyDir (/runs/<name>) and exits with first on its first run
// and then with later: what a restart rule sees on each exit.
const runsThenExits = `n=$(cat /runs/$NAME 2>/dev/null || echo 0); n=$((n+1)); echo $n > /runs/$NAME; [ $n -eq 1 ] && exit $FIRST; exit $LATER`

// TestContainerRestartRules: a container's restartPolicy overrides the
// pod's, and its restartPolicyRules decide on each exit code first, as the
// kubelet v1.37 does (KEP-5307). In an Always pod: "once" (restartPolicy
// Never) is not restarted; "retry" (Restart In [42]) is restarted after 42
// and not after 3; "notin" (Restart NotIn [0]) after 5 and not after 0; the
// init container "setup" (OnFailure) is restarted after its failure. With
// every container ended for good, the pod is Failed.
func TestContainerRestartRules(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("rules.yaml", `apiVersion: v1
kind: Pod
metadata:
  name: rules
spec:
  restartPolicy: Always
  volumes: [{name: runs, emptyDir: {}}]
  initContainers:
  - name: setup
    image: busybox:1.36
    restartPolicy: OnFailure
    command: ["sh", "-c", "`+runsThenExits+`"]
    env: [{name: NAME, value: setup}, {name: FIRST, value: "1"}, {name: LATER, value: "0"}]
    volumeMounts: [{name: runs, mountPath: /runs}]
  containers:
  - name: once
    image: busybox:1.36
    restartPolicy: Never
    command: ["sh", "-c", "exit 1"]
  - name: retry
    image: busybox:1.36
    restartPolicy: Never
    restartPolicyRules:
    - action: Restart
      exitCodes: {operator: In, values: [42]}
    command: ["sh", "-c", "`+runsThenExits+`"]
    env: [{name: NAME, value: retry}, {name: FIRST, value: "42"}, {name: LATER, value: "3"}]
    volumeMounts: [{name: runs, mountPath: /runs}]
  - name: notin
    image: busybox:1.36
    restartPolicy: Never
    restartPolicyRules:
    - action: Restart
      exitCodes: {operator: NotIn, values: [0]}
    command: ["sh", "-c", "`+runsThenExits+`"]
    env: [{name: NAME, value: notin}, {name: FIRST, value: "5"}, {name: LATER, value: "0"}]
    volumeMounts: [{name: runs, mountPath: /runs}]
`)
	p := n.waitPod("rules", "Failed", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodFailed })
	want := map[string]struct{ restarts, exit int32 }{
		"once": {0, 1}, "retry": {1, 3}, "notin": {1, 0},
	}
	for _, cs := range p.Status.ContainerStatuses {
		w := want[cs.Name]
		term := cs.State.Terminated
		if term == nil || term.ExitCode != w.exit || cs.RestartCount != w.restarts {
			t.Errorf("%s: restarts %d, state %+v; want %d restarts, terminated with %d", cs.Name, cs.RestartCount, cs.State, w.restarts, w.exit)
		}
	}
	if ic := p.Status.InitContainerStatuses[0]; ic.RestartCount != 1 || ic.State.Terminated == nil || ic.State.Terminated.ExitCode != 0 {
		t.Errorf("setup: restarts %d, state %+v; want 1 restart, then completed", ic.RestartCount, ic.State)
	}
	if t.Failed() {
		t.Logf("status: %s", statusJSON(p))
	}
}

// TestRestartAllContainers: an exit that a RestartAllContainers rule
// matches stops every container, removes them and starts the pod over in
// the same sandbox, as the kubelet v1.37 does (KEP-5532): the init
// container runs again, every container's restart count goes up by one
// with lastState RestartingAllContainers (137), and the pod keeps its IP,
// which its server container prints on each run.
func TestRestartAllContainers(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("reset.yaml", `apiVersion: v1
kind: Pod
metadata:
  name: reset
spec:
  restartPolicy: Never
  volumes: [{name: runs, emptyDir: {}}]
  initContainers:
  - name: init
    image: busybox:1.36
    command: ["sh", "-c", "echo run >> /runs/init"]
    volumeMounts: [{name: runs, mountPath: /runs}]
  containers:
  - name: server
    image: busybox:1.36
    command: ["sh", "-c", "ip -4 -o addr show eth0; echo up >> /runs/server; exec sleep 3600"]
    volumeMounts: [{name: runs, mountPath: /runs}]
  - name: trigger
    image: busybox:1.36
    restartPolicy: Never
    restartPolicyRules:
    - action: RestartAllContainers
      exitCodes: {operator: In, values: [9]}
    # The first run waits for the server's first run, then exits 9;
    # later runs stay up.
    command: ["sh", "-c", "[ -f /runs/trigger ] && exec sleep 3600; touch /runs/trigger; until [ -f /runs/server ]; do sleep 0.1; done; exit 9"]
    volumeMounts: [{name: runs, mountPath: /runs}]
`)
	p := n.waitPod("reset", "restarted in place and running", func(p *v1.Pod) bool {
		if p.Status.Phase != v1.PodRunning || len(p.Status.ContainerStatuses) != 2 {
			return false
		}
		for _, cs := range p.Status.ContainerStatuses {
			if cs.RestartCount != 1 || cs.State.Running == nil {
				return false
			}
		}
		return true
	})
	for _, cs := range append(p.Status.ContainerStatuses, p.Status.InitContainerStatuses...) {
		last := cs.LastTerminationState.Terminated
		if cs.RestartCount != 1 || last == nil || last.Reason != "RestartingAllContainers" || last.ExitCode != 137 {
			t.Errorf("%s: restarts %d, lastState %+v; want 1 restart after RestartingAllContainers (137)", cs.Name, cs.RestartCount, last)
		}
	}
	if ic := p.Status.InitContainerStatuses[0]; ic.State.Terminated == nil || ic.State.Terminated.ExitCode != 0 {
		t.Errorf("init: state %+v, want completed again", ic.State)
	}
	var ips []string
	for restart := range 2 {
		lines := n.readLog(n.logPath(p, "server", restart))
		if len(lines) == 0 {
			t.Fatalf("server run %d printed nothing", restart)
		}
		ips = append(ips, lines[0].content)
	}
	if ips[0] != ips[1] || !strings.Contains(ips[0], " "+p.Status.PodIP+"/") {
		t.Errorf("server's address per run %q, pod IP %s: want the same address on both runs", ips, p.Status.PodIP)
	}
	if !podConditionTrue(p, v1.PodInitialized) {
		t.Errorf("not Initialized: %s", statusJSON(p))
	}
	restarting := slices.IndexFunc(p.Status.Conditions, func(c v1.PodCondition) bool { return c.Type == v1.AllContainersRestarting })
	if restarting < 0 || p.Status.Conditions[restarting].Status != v1.ConditionFalse {
		t.Errorf("want AllContainersRestarting False once restarted: %s", statusJSON(p))
	}
}
