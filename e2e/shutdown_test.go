package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/internal/testenv"
)

// shutdownPod records its preStop hook and its SIGTERM in a shared file,
// so the order in which pods stopped can be read back.
func shutdownPod(name, marks, spec string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %[1]s
spec:
  terminationGracePeriodSeconds: 30
%[3]s  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", 'trap "echo %[1]s-term >> /marks/log; exit 0" TERM; sleep 3600 & wait']
    lifecycle:
      preStop: {exec: {command: ["sh", "-c", "echo %[1]s-prestop >> /marks/log"]}}
    volumeMounts: [{name: marks, mountPath: /marks}]
  volumes:
  - {name: marks, hostPath: {path: %[2]s, type: Directory}}
`, name, marks, spec)
}

// Graceful node shutdown against logind's D-Bus API (a test bus where
// the test plays logind, as the kubelet's own tests fake it): noderun takes
// a delay lock; on PrepareForShutdown(true) the regular pod's preStop hook
// and SIGTERM come before the critical pod's, both end Failed with the
// kubelet's reason and message, a new pod is rejected, the node is not
// Ready, and only then is the lock released. A cancellation takes the lock
// again and makes the node Ready.
func TestGracefulNodeShutdown(t *testing.T) {
	t.Parallel()
	bus := testenv.StartBus(t)
	logind := testenv.ServeLogind(t, bus, time.Hour) // no drop-in needed: nothing written to /etc
	n := newNodeEnv(t, noderunBin, nil, []string{"DBUS_SYSTEM_BUS_ADDRESS=" + bus},
		"--shutdown-grace-period", "40s", "--shutdown-grace-period-critical-pods", "15s")
	waitUntil(t, "noderun holds a delay lock", func() bool { return logind.Held() == 1 })
	if calls := logind.Calls(); !slices.Equal(calls, []string{"Inhibit shutdown noderun delay"}) {
		t.Errorf("logind calls %q, want one delay lock on shutdown", calls)
	}
	marks := filepath.Join(n.root, "marks")
	if err := os.Mkdir(marks, 0o755); err != nil {
		t.Fatal(err)
	}
	n.writeManifest("web.yaml", shutdownPod("web", marks, ""))
	n.writeManifest("crit.yaml", shutdownPod("crit", marks, "  priorityClassName: system-node-critical\n"))
	n.waitPod("web", "Running", running)
	n.waitPod("crit", "Running", running)

	if err := logind.PrepareForShutdown(true); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the lock released once the pods stopped", func() bool { return logind.Held() == 0 })
	b, _ := os.ReadFile(filepath.Join(marks, "log"))
	if got, want := strings.Fields(string(b)), []string{"web-prestop", "web-term", "crit-prestop", "crit-term"}; !slices.Equal(got, want) {
		t.Errorf("stop order %q, want %q: the regular pod's hook and stop before the critical pod's", got, want)
	}
	const msg = "Pod was terminated in response to imminent node shutdown."
	for _, name := range []string{"web", "crit"} {
		p := n.waitPod(name, "Failed, Terminated", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodFailed })
		if p.Status.Reason != "Terminated" || p.Status.Message != msg ||
			!slices.ContainsFunc(p.Status.Conditions, func(c v1.PodCondition) bool {
				return c.Type == v1.DisruptionTarget && c.Status == v1.ConditionTrue && c.Reason == "TerminationByKubelet"
			}) {
			t.Errorf("%s: status %s, want the kubelet's node shutdown status", name, statusJSON(p))
		}
		if cs := p.Status.ContainerStatuses; len(cs) != 1 || cs[0].State.Terminated == nil || cs[0].State.Terminated.ExitCode != 0 {
			t.Errorf("%s: container status %s, want terminated by its own trap (exit 0)", name, statusJSON(p))
		}
	}
	n.writeManifest("late.yaml", admissionPod("late", "", ""))
	n.rejected("late", "NodeShutdown", "Pod was rejected as the node is shutting down.")
	view := n.kubeconfig(false)
	ready := `{.status.conditions[?(@.type=="Ready")].status} {.status.conditions[?(@.type=="Ready")].message}`
	if got := n.kubectlOK(view, "get", "node", nodeName, "-o", "jsonpath="+ready); got != "False node is shutting down" {
		t.Errorf("node Ready %q, want False node is shutting down", got)
	}

	if err := logind.PrepareForShutdown(false); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the lock taken again after the cancellation", func() bool { return logind.Held() == 1 })
	waitUntil(t, "the node Ready again", func() bool {
		return strings.HasPrefix(n.kubectlOK(view, "get", "node", nodeName, "-o", "jsonpath="+ready), "True")
	})
	if p := n.waitPod("web", "still Failed", func(*v1.Pod) bool { return true }); p.Status.Phase != v1.PodFailed {
		t.Errorf("web after the cancellation: %s, want it left stopped", statusJSON(p))
	}
}
