package e2e

import (
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/internal/cgroups"
	"github.com/noderun/noderun/runner"
)

// cgroupPod is a pod of one sleeping container with the given resources
// (a YAML flow map, or "" for none).
func cgroupPod(name, resources string) string {
	r := ""
	if resources != "" {
		r = "\n    resources: " + resources
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: busybox:1.36
    command: ["sleep", "3600"]%s
`, name, r)
}

// cgroupValue reads one of the limits the kubelet sets from a cgroup
// (cgroupfs driver) on either hierarchy: on v1 cpu.shares,
// cpu.cfs_quota_us, memory.limit_in_bytes, memory.memsw.limit_in_bytes,
// cgroup.procs; on v2 cpu.weight, cpu.max's quota, memory.max,
// memory.swap.max, cgroup.procs.
func cgroupValue(dir, v1file string) string {
	controller, _, _ := strings.Cut(v1file, ".")
	if controller == "cgroup" {
		controller = "cpu" // cgroup.procs: any hierarchy has it
	}
	path := filepath.Join("/sys/fs/cgroup", controller, dir, v1file)
	if unified {
		v2 := map[string]string{"cpu.shares": "cpu.weight", "cpu.cfs_quota_us": "cpu.max", "cpu.cfs_period_us": "cpu.max",
			"memory.limit_in_bytes": "memory.max", "memory.memsw.limit_in_bytes": "memory.swap.max"}[v1file]
		if v2 == "" {
			v2 = v1file
		}
		path = filepath.Join("/sys/fs/cgroup", dir, v2)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	v := strings.TrimSpace(string(b))
	if quota, period, ok := strings.Cut(v, " "); ok && unified { // cpu.max
		if v1file == "cpu.cfs_period_us" {
			return period
		}
		return quota
	}
	return v
}

// unified: this host has cgroup v2 alone.
var unified = func() bool {
	_, err := os.Stat("/sys/fs/cgroup/cgroup.controllers")
	return err == nil
}()

// onV2 gives a cgroup value as v2 shows it: shares as cpu.weight, an
// unlimited quota as max, no swap (memory+swap = memory) as 0.
func onV2(file, v string) string {
	switch {
	case !unified:
		return v
	case file == "cpu.shares":
		shares, _ := strconv.ParseUint(v, 10, 64)
		return strconv.FormatUint(cgroups.SharesToWeight(shares), 10)
	case file == "cpu.cfs_quota_us" && v == "-1":
		return "max"
	case file == "memory.memsw.limit_in_bytes":
		return "0"
	}
	return v
}

// privateCgroupRoot names a --cgroup-root of the test's own, so that its
// QoS parents are its own (other nodes' pods change theirs). They go after
// the node's cleanup has removed the pods, as reset removes them.
func privateCgroupRoot(t *testing.T) string {
	root := "e2e_" + strings.ToLower(rand.Text()[:10])
	t.Cleanup(func() {
		for _, h := range cgroupRoots(t) {
			for _, d := range []string{"burstable", "besteffort", ""} {
				_ = unix.Rmdir(filepath.Join(h, root, d))
			}
		}
	})
	return root
}

// Pods' cgroups as the kubelet makes them, read from the kernel's files
// on this host (cgroupfs, v1 or v2): a Guaranteed pod's at the top of the
// root with shares, quota and memory limit summed from its containers; a
// Burstable one in burstable/, limited only where every container is;
// a BestEffort one in besteffort/ with 2 shares. Their containers below,
// with memory+swap equal to the memory limit where the kernel accounts
// swap (the kubelet's NoSwap). The burstable parent's shares follow the
// Burstable pods' requests as they come and go, and a restarted noderun
// keeps every cgroup, its processes in it; reset removes them all.
func TestPodCgroupsPerQoS(t *testing.T) {
	t.Parallel()
	root := privateCgroupRoot(t)
	n := newNode(t, "--cgroup-root", root)
	n.writeManifest("g.yaml", cgroupPod("guaranteed", "{limits: {cpu: 500m, memory: 64Mi}}"))
	n.writeManifest("b.yaml", cgroupPod("burstable", "{requests: {cpu: 250m, memory: 32Mi}, limits: {cpu: '1', memory: 128Mi}}"))
	n.writeManifest("be.yaml", cgroupPod("besteffort", ""))
	podDir := map[string]string{}
	ctrDir := map[string]string{}
	for name, tier := range map[string]string{"guaranteed": "", "burstable": "burstable", "besteffort": "besteffort"} {
		p := n.waitPod(name, "Running", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodRunning })
		podDir[name] = filepath.Join("/", root, tier, "pod"+runner.SandboxID(string(p.UID)))
		ctrDir[name] = filepath.Join(podDir[name], strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://"))
	}
	check := func(when string) {
		t.Helper()
		for _, c := range []struct{ controller, dir, file, want string }{
			{"cpu", podDir["guaranteed"], "cpu.shares", "512"},
			{"cpu", podDir["guaranteed"], "cpu.cfs_quota_us", "50000"},
			{"cpu", podDir["guaranteed"], "cpu.cfs_period_us", "100000"},
			{"memory", podDir["guaranteed"], "memory.limit_in_bytes", "67108864"},
			{"cpu", podDir["burstable"], "cpu.shares", "256"},
			{"cpu", podDir["burstable"], "cpu.cfs_quota_us", "100000"},
			{"memory", podDir["burstable"], "memory.limit_in_bytes", "134217728"},
			{"cpu", podDir["besteffort"], "cpu.shares", "2"},
			{"cpu", podDir["besteffort"], "cpu.cfs_quota_us", "-1"},
			{"cpu", ctrDir["guaranteed"], "cpu.shares", "512"},
			{"cpu", ctrDir["guaranteed"], "cpu.cfs_quota_us", "50000"},
			{"memory", ctrDir["guaranteed"], "memory.limit_in_bytes", "67108864"},
			{"cpu", ctrDir["burstable"], "cpu.shares", "256"},
			{"cpu", ctrDir["burstable"], "cpu.cfs_quota_us", "100000"},
			{"memory", ctrDir["burstable"], "memory.limit_in_bytes", "134217728"},
			{"cpu", ctrDir["besteffort"], "cpu.shares", "2"},
			{"cpu", "/" + root + "/besteffort", "cpu.shares", "2"},
			{"cpu", "/" + root + "/burstable", "cpu.shares", "256"},
		} {
			if got, want := cgroupValue(c.dir, c.file), onV2(c.file, c.want); got != want {
				t.Errorf("%s: %s/%s = %s, want %s", when, c.dir, c.file, got, want)
			}
		}
		for name, dir := range ctrDir {
			if procs := cgroupValue(dir, "cgroup.procs"); procs == "" || strings.HasPrefix(procs, "(") {
				t.Errorf("%s: %s's container cgroup %s holds no process: %q", when, name, dir, procs)
			}
		}
		if (cgroups.Layout{Unified: unified}).SwapControl() {
			for name, want := range map[string]string{"guaranteed": "67108864", "burstable": "134217728", "besteffort": ""} {
				if name == "besteffort" && !unified {
					continue // no memory limit: the kubelet's 0 leaves memory+swap unset
				}
				file := "memory.memsw.limit_in_bytes"
				if got, want := cgroupValue(ctrDir[name], file), onV2(file, want); got != want {
					t.Errorf("%s: %s's memory+swap limit %s, want %s (no swap)", when, name, got, want)
				}
			}
		}
	}
	check("running")
	burstShares := func(want string) func() bool {
		return func() bool { return cgroupValue("/"+root+"/burstable", "cpu.shares") == onV2("cpu.shares", want) }
	}
	n.writeManifest("b2.yaml", cgroupPod("burstable2", "{requests: {cpu: 500m}}"))
	n.waitPod("burstable2", "Running", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodRunning })
	waitUntil(t, "the burstable parent's shares are 250m + 500m's, 768", burstShares("768"))
	n.removeManifest("b2.yaml")
	n.waitGone("burstable2", waitTimeout)
	waitUntil(t, "the burstable parent's shares are 250m's again, 256", burstShares("256"))

	// A Burstable pod that ends counts no more.
	n.writeManifest("done.yaml", strings.Replace(strings.Replace(cgroupPod("done", "{requests: {cpu: 500m}}"),
		`command: ["sleep", "3600"]`, `command: ["sleep", "1"]`, 1), "spec:\n", "spec:\n  restartPolicy: Never\n", 1))
	done := n.waitPod("done", "Succeeded", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodSucceeded })
	if got := cgroupValue(filepath.Join("/", root, "burstable", "pod"+runner.SandboxID(string(done.UID))), "cpu.shares"); got != onV2("cpu.shares", "512") {
		t.Errorf("the ended pod's cgroup: shares %s, want 512", got)
	}
	waitUntil(t, "the burstable parent's shares are 256 with the ended pod", burstShares("256"))

	n.stop()
	n.start()
	for name := range podDir {
		p := n.waitPod(name, "Running", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodRunning })
		if cs := p.Status.ContainerStatuses[0]; cs.RestartCount != 0 || filepath.Base(ctrDir[name]) != strings.TrimPrefix(cs.ContainerID, "containerd://") {
			t.Errorf("%s after the restart: container %s, %d restarts; want the adopted one", name, cs.ContainerID, cs.RestartCount)
		}
	}
	// Each adopted pod sets the parents' shares again as it is synced; the
	// ended pod is taken out once its status is known again.
	waitUntil(t, "the burstable parent's shares are 256 after the restart", burstShares("256"))
	check("after a noderun restart")

	// reset removes the pods, then their QoS parents and the root.
	n.stop()
	if out, err := exec.Command(noderunBin, append(n.flags(), "reset")...).CombinedOutput(); err != nil {
		t.Fatalf("noderun reset: %v\n%s", err, out)
	}
	for _, h := range cgroupRoots(t) {
		if dir := filepath.Join(h, root); exists(dir) {
			t.Errorf("%s left after reset", dir)
		}
	}
}

// TestPodLevelResourcesCgroups: a pod's spec.resources (PodLevelResources,
// on in v1.37) decide its QoS class and its cgroup's limits, and a
// container without limits of its own gets the pod's, as the kubelet does:
// read from the kernel's files on this host.
func TestPodLevelResourcesCgroups(t *testing.T) {
	t.Parallel()
	root := privateCgroupRoot(t)
	n := newNode(t, "--cgroup-root", root)
	withPodResources := func(name, r string) string {
		return strings.Replace(cgroupPod(name, ""), "spec:\n", "spec:\n  resources: "+r+"\n", 1)
	}
	n.writeManifest("b.yaml", withPodResources("plr-burstable", "{requests: {cpu: 500m, memory: 64Mi}, limits: {cpu: '1', memory: 128Mi}}"))
	n.writeManifest("g.yaml", withPodResources("plr-guaranteed", "{requests: {cpu: 250m, memory: 32Mi}, limits: {cpu: 250m, memory: 32Mi}}"))
	for _, tc := range []struct {
		name, tier string
		qos        v1.PodQOSClass
		pod, ctr   map[string]string
	}{
		{"plr-burstable", "burstable", v1.PodQOSBurstable,
			map[string]string{"cpu.shares": "512", "cpu.cfs_quota_us": "100000", "memory.limit_in_bytes": "134217728"},
			map[string]string{"cpu.shares": "1024", "cpu.cfs_quota_us": "100000", "memory.limit_in_bytes": "134217728"}},
		{"plr-guaranteed", "", v1.PodQOSGuaranteed,
			map[string]string{"cpu.shares": "256", "cpu.cfs_quota_us": "25000", "memory.limit_in_bytes": "33554432"},
			map[string]string{"cpu.shares": "256", "cpu.cfs_quota_us": "25000", "memory.limit_in_bytes": "33554432"}},
	} {
		p := n.waitPod(tc.name, "Running", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodRunning })
		if p.Status.QOSClass != tc.qos {
			t.Errorf("%s: qosClass %s, want %s", tc.name, p.Status.QOSClass, tc.qos)
		}
		podDir := filepath.Join("/", root, tc.tier, "pod"+runner.SandboxID(string(p.UID)))
		ctrDir := filepath.Join(podDir, strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://"))
		for dir, want := range map[string]map[string]string{podDir: tc.pod, ctrDir: tc.ctr} {
			for file, v := range want {
				if got := cgroupValue(dir, file); got != onV2(file, v) {
					t.Errorf("%s: %s/%s = %s, want %s", tc.name, dir, file, got, onV2(file, v))
				}
			}
		}
	}
}
