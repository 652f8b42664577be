package vm

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// proofDir is the hostPath the shutdown scenario's pods write to: on the
// machine's root, so it outlives the poweroff.
const proofDir = "/var/lib/shutdown-proof"

// shutdownPod is a pod whose preStop hook and SIGTERM handler each append
// a line to proofDir/log and sync it, so that what ran before the machine
// went down is read after the next boot.
func shutdownPod(name, priorityClass string) string {
	line := func(what string) string { return fmt.Sprintf("echo %s-%s >> /proof/log; sync", what, name) }
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
spec:
  priorityClassName: %s
  terminationGracePeriodSeconds: 30
  volumes:
  - name: proof
    hostPath: {path: %s, type: DirectoryOrCreate}
  containers:
  - name: app
    image: %s
    command: ["sh", "-c", "trap '%s; exit 0' TERM; %s; while true; do sleep 1; done"]
    volumeMounts: [{name: proof, mountPath: /proof}]
    lifecycle:
      preStop:
        exec: {command: ["sh", "-c", "%s"]}
`, name, priorityClass, proofDir, busyboxImage, line("term"), line("start"), line("prestop"))
}

// TestVMGracefulShutdown: with --shutdown-grace-period, systemctl poweroff
// waits (logind's delay lock) while noderun stops the pods as the kubelet
// does at a node shutdown: preStop hooks, then SIGTERM, the ordinary pods
// first, the critical ones (system-node-critical) after them. The pods'
// lines, synced to the machine's disk, are read after the next boot.
func TestVMGracefulShutdown(t *testing.T) {
	n := bootNode(t, "systemd")
	n.write("/etc/noderun/env", "NODERUN_CGROUP_DRIVER=systemd\nNODERUN_SHUTDOWN_GRACE_PERIOD=60s\nNODERUN_SHUTDOWN_GRACE_PERIOD_CRITICAL_PODS=20s\n", 0o600)
	n.sh("systemctl restart noderun")
	n.apply("web", shutdownPod("web", ""))
	n.apply("agent", shutdownPod("agent", "system-node-critical"))
	n.waitPods("web and agent running", running("web", "agent"))
	n.waitPods("both pods' start lines written", func(map[string]v1.Pod) bool {
		out, _ := n.try("cat " + proofDir + "/log")
		return strings.Contains(out, "start-web") && strings.Contains(out, "start-agent")
	})
	if out := n.sh("systemd-inhibit --list --no-pager"); !strings.Contains(out, "noderun") || !strings.Contains(out, "delay") {
		t.Errorf("no delay lock of noderun's before the poweroff:\n%s", out)
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	if err := n.vm.Poweroff(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("systemctl poweroff took %s", time.Since(start).Round(time.Second))
	if err := n.vm.Boot(ctx); err != nil {
		t.Fatal(err)
	}
	got := strings.Fields(n.sh("cat " + proofDir + "/log"))
	want := []string{"prestop-web", "term-web", "prestop-agent", "term-agent"}
	var seen []string
	for _, l := range got {
		if !strings.HasPrefix(l, "start-") {
			seen = append(seen, l)
		}
	}
	if strings.Join(seen, " ") != strings.Join(want, " ") {
		t.Errorf("what the pods wrote before the poweroff: %q; want, after their start lines, %q (the critical pod's hook and SIGTERM after the other's)", got, want)
	}
	t.Logf("the pods' lines after the reboot: %q", got)
}
