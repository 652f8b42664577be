package e2e

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestOOMScoreAdjAsTheKubelet: each container's process has the kubelet's
// oom_score_adj for its pod, raised to what this host lets noderun give
// (its own score, without CAP_SYS_RESOURCE), with one warning saying so.
func TestOOMScoreAdjAsTheKubelet(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	memTotal := meminfo(t, "MemTotal")
	floor := hostOOMFloor(t) // noderun is started by this process: the same caps and score
	pods := []struct {
		name, spec string
		want       int // the kubelet's
	}{
		{"guaranteed", "resources: {limits: {cpu: 100m, memory: 32Mi}}", -997},
		{"burstable", "resources: {requests: {memory: 512Mi}}", int(1000 - 1000*(512<<20)/memTotal)},
		{"besteffort", "", 1000},
		{"node-critical", "", -997},
		{"cluster-critical", "", 1000}, // a static pod is critical, but only system-node-critical gets -997
	}
	for _, p := range pods {
		class := ""
		if strings.HasSuffix(p.name, "-critical") {
			class = "  priorityClassName: system-" + p.name + "\n"
		}
		n.writeManifest(p.name+".yaml", fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
spec:
%s  containers:
  - name: main
    image: busybox:1.36
    command: ["sleep", "3600"]
    %s
`, p.name, class, p.spec))
	}
	for _, p := range pods {
		pod := n.waitPod(p.name, "Running", running)
		got := readInt(t, fmt.Sprintf("/proc/%d/oom_score_adj", n.mainPID(pod, "main")))
		want := max(p.want, floor)
		t.Logf("%s (%s): oom_score_adj %d; the kubelet's %d, this host's floor %d", p.name, pod.Status.QOSClass, got, p.want, floor)
		if got != want {
			t.Errorf("%s: oom_score_adj %d, want %d (the kubelet's %d, floor %d)", p.name, got, want, p.want, floor)
		}
	}
	warning := regexp.MustCompile(`oom_score_adj raised to noderun's own`)
	if floor <= -997 {
		return // nothing to raise on a host with CAP_SYS_RESOURCE
	}
	n.waitOutput(warning)
	out, err := os.ReadFile(n.out)
	if err != nil {
		t.Fatal(err)
	}
	if c := len(warning.FindAll(out, -1)); c != 1 {
		t.Errorf("the warning was logged %d times, want once", c)
	}
}

// meminfo is a /proc/meminfo figure in bytes: MemTotal is the capacity
// noderun and the kubelet divide requests by, SwapTotal the swap
// LimitedSwap shares out.
func meminfo(t *testing.T, key string) int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^` + key + `:\s+(\d+) kB`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("no %s in /proc/meminfo", key)
	}
	kb, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return kb << 10
}

// hostOOMFloor is the lowest score this process may give: any with
// CAP_SYS_RESOURCE, else its own.
func hostOOMFloor(t *testing.T) int {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^CapEff:\s+([0-9a-f]+)`).FindSubmatch(status)
	if caps, err := strconv.ParseUint(string(m[1]), 16, 64); err == nil && caps&(1<<24) != 0 {
		return -1000
	}
	return readInt(t, "/proc/self/oom_score_adj")
}

func readInt(t *testing.T, path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return v
}
