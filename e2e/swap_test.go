package e2e

import (
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/internal/cgroups"
	"github.com/noderun/noderun/runner"
)

// TestLimitedSwap: with --memory-swap-behavior LimitedSwap, a Burstable
// container (memory request below its limit) gets its request's share of
// the machine's swap on cgroup v2, and no swap on v1, where the kubelet
// falls back to NoSwap: memory+swap equal to the memory limit. Read from
// the kernel's files on this host.
func TestLimitedSwap(t *testing.T) {
	t.Parallel()
	if !(cgroups.Layout{Unified: unified}).SwapControl() {
		t.Skip("the kernel does not account swap (no memsw / memory.swap.max): containers' swap cannot be limited")
	}
	root := privateCgroupRoot(t)
	n := newNode(t, "--cgroup-root", root, "--memory-swap-behavior", "LimitedSwap")
	n.writeManifest("b.yaml", cgroupPod("burstable", "{requests: {memory: 32Mi}, limits: {memory: 128Mi}}"))
	p := n.waitPod("burstable", "Running", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodRunning })
	dir := filepath.Join("/", root, "burstable", "pod"+runner.SandboxID(string(p.UID)),
		strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://"))
	want := "134217728" // v1: memory+swap = memory limit
	if unified {
		mem, swap := meminfo(t, "MemTotal"), meminfo(t, "SwapTotal")
		want = strconv.FormatInt(int64(float64(32<<20)/float64(mem)*float64(swap)), 10)
	}
	if got := cgroupValue(dir, "memory.memsw.limit_in_bytes"); got != want {
		t.Errorf("%s: swap limit %s, want %s", dir, got, want)
	}
}
