package e2e

import (
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
