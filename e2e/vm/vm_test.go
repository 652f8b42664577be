// Package vm is make test-vm: noderun installed from its .deb on a Debian
// 12 machine booted by qemu (internal/testvm), with systemd as PID 1 and
// cgroup v2, driven over ssh. The tests need NODERUN_VM=1 and skip
// otherwise, so make test, which runs ./..., leaves them out.
package vm

import (
	"fmt"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/internal/cgroups"
)

// TestVMDrivers runs the cgroup, OOM, stop/restart, watchdog and journal
// scenarios on a machine per cgroup driver.
func TestVMDrivers(t *testing.T) {
	for _, driver := range []string{"systemd", "cgroupfs"} {
		t.Run(driver, func(t *testing.T) {
			n := bootNode(t, driver)
			qosPods(n)
			t.Run("OOMKilled", func(t *testing.T) { n.t = t; oomKilled(n) })
			t.Run("StopKeepsPodsRestartAdopts", func(t *testing.T) { n.t = t; stopAndRestart(n) })
			if driver == "systemd" {
				t.Run("Journal", func(t *testing.T) { n.t = t; journal(n) })
				t.Run("Watchdog", func(t *testing.T) { n.t = t; watchdog(n) })
			}
			t.Run("ResetAndRemove", func(t *testing.T) { n.t = t; resetAndRemove(n) })
		})
	}
}

// The QoS classes' pods: each container runs `sleep <marker>`, so that
// its process, and from it its cgroup, is found by command line.
var qos = []struct {
	name, marker, resources string
	tier                    cgroups.Tier
	shares                  uint64 // the pod cgroup's, from its cpu requests
	cpuMax, memoryMax       string // the pod's and its container's
}{
	{"guaranteed", "1000001", `    resources:
      requests: {cpu: 500m, memory: 64Mi}
      limits: {cpu: 500m, memory: 64Mi}
`, cgroups.Guaranteed, 512, "50000 100000", "67108864"},
	{"burstable", "1000002", `    resources:
      requests: {cpu: 100m, memory: 32Mi}
      limits: {memory: 128Mi}
`, cgroups.Burstable, 102, "max 100000", "134217728"},
	{"besteffort", "1000003", "", cgroups.BestEffort, cgroups.MinShares, "max 100000", "max"},
}

// cgroupV1 is the kernel argument that boots systemd 252 (Debian 12) on
// cgroup v1: its hybrid layout, the v1 controllers' hierarchies with its
// own tracking in a cgroup2 at /sys/fs/cgroup/unified.
const cgroupV1 = "systemd.unified_cgroup_hierarchy=0"

// TestVMCgroupV1 runs the QoS and OOM scenarios on a machine booted on
// cgroup v1, where the kubelet's limits are cpu.shares, the CFS quota and
// memory.limit_in_bytes (and memory+swap equal to it, the kubelet's
// NoSwap on v1).
func TestVMCgroupV1(t *testing.T) {
	for _, driver := range []string{"systemd", "cgroupfs"} {
		t.Run(driver, func(t *testing.T) {
			n := bootNode(t, driver, cgroupV1)
			qosPods(n)
			t.Run("OOMKilled", func(t *testing.T) { n.t = t; oomKilled(n) })
		})
	}
}

// qosPods runs a pod of each QoS class and reads, from the kernel, the
// cgroups its container is in: the container's, the pod's and the QoS
// tier's, as the kubelet lays them out for the driver, with the limits of
// the pod's resources. Under the systemd driver the pod's cgroup is a
// slice systemd runs, with the same limits as its properties.
func qosPods(n *node) {
	n.t.Helper()
	names := make([]string, len(qos))
	for i, p := range qos {
		n.apply(p.name, sleepPod(p.name, p.marker, p.resources))
		names[i] = p.name
	}
	n.waitPods("the QoS pods running", running(names...))
	for _, p := range qos {
		ctr, pod, tier := n.cgroupsOf(p.name, p.marker, p.tier)
		if n.driver == "systemd" {
			podBase, ctrBase := path.Base(pod), path.Base(ctr)
			if got := strings.TrimSpace(n.sh("systemctl is-active " + podBase + " " + ctrBase)); got != "active\nactive" {
				n.t.Errorf("%s: systemctl is-active %s %s: %q, want both active", p.name, podBase, ctrBase, got)
			}
			prop, want := "MemoryMax", strings.Replace(p.memoryMax, "max", "infinity", 1)
			if n.v1 {
				prop = "MemoryLimit"
			}
			if mem := strings.TrimSpace(n.sh("systemctl show -P " + prop + " " + podBase)); mem != want {
				n.t.Errorf("%s: slice %s %s=%s, want %s", p.name, podBase, prop, mem, want)
			}
		}
		n.checkFiles(p.name, qosFiles(p.tier, p.shares, p.cpuMax, p.memoryMax, ctr, pod, tier, n.v1, n.swapAccounting()))
	}
}

// cgroupsOf finds the cgroups of the container running `sleep marker`
// from /proc/PID/cgroup (v1: the cpu controller's line) and checks that
// they are laid out as the kubelet's for the driver: container in pod in
// QoS tier (Guaranteed's pods directly in the root).
func (n *node) cgroupsOf(name, marker string, t cgroups.Tier) (ctr, pod, tier string) {
	n.t.Helper()
	pid := n.pid("sleep " + marker)
	lines := n.sh("cat /proc/" + pid + "/cgroup")
	re := regexp.MustCompile(`(?m)^0::(.*)$`)
	if n.v1 {
		re = regexp.MustCompile(`(?m)^\d+:[^:]*\bcpu\b[^:]*:(.*)$`)
	}
	m := re.FindStringSubmatch(lines)
	if m == nil {
		n.t.Fatalf("%s: /proc/%s/cgroup has no line %s:\n%s", name, pid, re, lines)
	}
	ctr = m[1]
	pod, tier = path.Dir(ctr), path.Dir(path.Dir(ctr))
	root := "/noderun"
	if n.driver == "systemd" {
		root = "/noderun.slice"
	}
	wantTier := root
	if t != cgroups.Guaranteed {
		wantTier = root + "/noderun-" + string(t) + ".slice"
		if n.driver == "cgroupfs" {
			wantTier = root + "/" + string(t)
		}
	} else {
		tier = path.Dir(pod)
	}
	if tier != wantTier {
		n.t.Errorf("%s: container cgroup %s: QoS parent %s, want %s", name, ctr, tier, wantTier)
	}
	podBase, ctrBase := path.Base(pod), path.Base(ctr)
	if n.driver == "systemd" {
		want := strings.TrimSuffix(path.Base(wantTier), ".slice") + "-pod"
		if !strings.HasPrefix(podBase, want) || !strings.HasSuffix(podBase, ".slice") || !strings.HasPrefix(ctrBase, "noderun-") || !strings.HasSuffix(ctrBase, ".scope") {
			n.t.Errorf("%s: cgroups %s in %s, want a scope noderun-<id>.scope in a slice %s<id>.slice", name, ctrBase, podBase, want)
		}
	} else if !strings.HasPrefix(podBase, "pod") {
		n.t.Errorf("%s: pod cgroup %s, want pod<id>", name, pod)
	}
	return ctr, pod, tier
}

// swapAccounting reports whether the v1 memory hierarchy limits
// memory+swap (the kernel's swapaccount), where the kubelet sets it.
func (n *node) swapAccounting() bool {
	_, err := n.try("test -e /sys/fs/cgroup/memory/memory.memsw.limit_in_bytes")
	return n.v1 && err == nil
}

// v1Unlimited is memory.limit_in_bytes with no limit (4 KiB pages).
const v1Unlimited = "9223372036854771712"

// qosFiles are the cgroup files (below /sys/fs/cgroup) the kubelet writes
// for a pod of one container with the given pod-level values, and what
// they hold: v2's cpu.weight, cpu.max, memory.max, pids.max; v1's
// cpu.shares, CFS quota, memory.limit_in_bytes (and memory+swap, equal to
// it, on the container), pids.max, each in its controller's hierarchy.
func qosFiles(t cgroups.Tier, shares uint64, cpuMax, memoryMax, ctr, pod, tier string, v1, memsw bool) map[string]string {
	if !v1 {
		want := map[string]string{
			pod + "/memory.max": memoryMax, pod + "/cpu.max": cpuMax,
			pod + "/cpu.weight": strconv.FormatUint(cgroups.SharesToWeight(shares), 10),
			// The kubelet's podPidsLimit is -1 (none) unless configured.
			pod + "/pids.max":   "max",
			ctr + "/memory.max": memoryMax, ctr + "/cpu.max": cpuMax,
		}
		if t != cgroups.Guaranteed {
			// The tier's weight: MinShares for BestEffort; the sum of its
			// pods' cpu requests for Burstable (this pod is its only one).
			want[tier+"/cpu.weight"] = want[pod+"/cpu.weight"]
		}
		return want
	}
	quota, _, _ := strings.Cut(cpuMax, " ")
	if quota == "max" {
		quota = "-1"
	}
	limit := strings.Replace(memoryMax, "max", v1Unlimited, 1)
	want := map[string]string{
		"/cpu" + pod + "/cpu.shares": strconv.FormatUint(shares, 10), "/cpu" + pod + "/cpu.cfs_quota_us": quota,
		"/memory" + pod + "/memory.limit_in_bytes": limit, "/pids" + pod + "/pids.max": "max",
		"/cpu" + ctr + "/cpu.cfs_quota_us": quota, "/memory" + ctr + "/memory.limit_in_bytes": limit,
	}
	if quota != "-1" {
		want["/cpu"+pod+"/cpu.cfs_period_us"] = "100000"
	}
	if memsw {
		want["/memory"+ctr+"/memory.memsw.limit_in_bytes"] = limit
	}
	if t != cgroups.Guaranteed {
		want["/cpu"+tier+"/cpu.shares"] = strconv.FormatUint(shares, 10)
	}
	return want
}

// checkFiles reads cgroup files (paths below /sys/fs/cgroup) and compares.
func (n *node) checkFiles(what string, want map[string]string) {
	n.t.Helper()
	for file, value := range want {
		got := strings.TrimSpace(n.sh("cat /sys/fs/cgroup" + file))
		if got != value {
			n.t.Errorf("%s: %s is %q, want %q", what, file, got, value)
		}
	}
}

// oomKilled: a container over its memory limit is killed by the kernel
// (its pod cgroup's memory.events counts it) and reported OOMKilled.
func oomKilled(n *node) {
	n.apply("oom", `apiVersion: v1
kind: Pod
metadata:
  name: oom
spec:
  restartPolicy: Never
  containers:
  - name: app
    image: `+busyboxImage+`
    command: ["dd", "if=/dev/zero", "of=/dev/null", "bs=64M", "count=1"]
    resources:
      limits: {memory: 32Mi}
`)
	pods := n.waitPods("the oom pod's container terminated", func(pods map[string]v1.Pod) bool {
		p := pods["oom"]
		return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Terminated != nil
	})
	term := pods["oom"].Status.ContainerStatuses[0].State.Terminated
	if p := pods["oom"].Status.Phase; p != v1.PodFailed {
		n.t.Errorf("oom: phase %s, want Failed", p)
	}
	// The pod's cgroup is the one limited to 32Mi.
	// v1: the limit and the count are the memory hierarchy's files.
	limit, events, dir := "memory.max", "memory.events", "/sys/fs/cgroup/noderun*"
	if n.v1 {
		limit, events, dir = "memory.limit_in_bytes", "memory.oom_control", "/sys/fs/cgroup/memory/noderun*"
	}
	kills := n.sh(fmt.Sprintf(`for f in $(grep -rlx 33554432 --include=%s %s); do
  d=$(dirname $f); case $d in *pod*) ;; *) continue ;; esac
  case $(basename $d) in *.scope|[0-9a-f][0-9a-f][0-9a-f][0-9a-f]*) continue ;; esac
  sed -n 's/^oom_kill //p' $d/%s
done`, limit, dir, events))
	// v2's memory.events counts the kills below the pod's cgroup too; v1's
	// oom_control counts only those at its own limit, and the container's
	// limit, the same, is hit first (seen in the VM: the pod's count 0),
	// so there only the one pod cgroup is required.
	if f := strings.Fields(kills); len(f) != 1 || (f[0] == "0" && !n.v1) {
		n.t.Errorf("oom: the pod cgroup's %s oom_kill: %q, want one cgroup with a count > 0", events, kills)
	}
	if term.Reason != "OOMKilled" || term.ExitCode != 137 {
		n.t.Errorf("oom: terminated %s exit %d, want OOMKilled 137", term.Reason, term.ExitCode)
	}
}

// stopAndRestart: systemctl stop stops noderun alone (KillMode=process),
// its pods run on; the next start adopts them, as does a restart, with the
// same processes and no restart counted. The counts are compared with
// those before the stop: under TCG a first sandbox's CNI ADD can time out
// and the pod's container then starts as its restart 1.
func stopAndRestart(n *node) {
	pids, restarts := map[string]string{}, map[string]int32{}
	before := n.waitPods("the QoS pods running", running("guaranteed", "burstable", "besteffort"))
	for _, p := range qos {
		pids[p.name] = n.pid("sleep " + p.marker)
		restarts[p.name] = before[p.name].Status.ContainerStatuses[0].RestartCount
	}
	check := func(after string) {
		pods := n.waitPods("the QoS pods running after "+after, running("guaranteed", "burstable", "besteffort"))
		for _, p := range qos {
			if got := n.pid("sleep " + p.marker); got != pids[p.name] {
				n.t.Errorf("%s: after %s the container's PID is %s, was %s", p.name, after, got, pids[p.name])
			}
			if rc := pods[p.name].Status.ContainerStatuses[0].RestartCount; rc != restarts[p.name] {
				n.t.Errorf("%s: after %s restart count %d, was %d", p.name, after, rc, restarts[p.name])
			}
		}
	}
	n.sh("systemctl stop noderun")
	if out, _ := n.try("systemctl is-active noderun"); strings.TrimSpace(out) != "inactive" {
		n.t.Errorf("systemctl is-active noderun after stop: %q", out)
	}
	for name, pid := range pids {
		if _, err := n.try("kill -0 " + pid); err != nil {
			n.t.Errorf("%s: process %s gone after systemctl stop noderun", name, pid)
		}
	}
	n.sh("systemctl start noderun")
	check("systemctl stop and start")
	n.sh("systemctl restart noderun")
	check("systemctl restart")
}

// journal: noderun's entries carry its fields (journald's own and each
// log attribute's), and systemctl status shows its status line.
func journal(n *node) {
	out := n.sh("journalctl -u noderun -o export --no-pager | grep -aE '^(SYSLOG_IDENTIFIER|PRIORITY|_SYSTEMD_UNIT|POD)=' | sort | uniq -c")
	for _, want := range []string{"SYSLOG_IDENTIFIER=noderun", "_SYSTEMD_UNIT=noderun.service", "PRIORITY=6", "POD=default/guaranteed"} {
		if !strings.Contains(out, want) {
			n.t.Errorf("journal fields of noderun's entries: no %s in\n%s", want, out)
		}
	}
	status, _ := n.try("systemctl status noderun --no-pager") // exit 3 only when inactive
	for _, want := range []string{"Active: active (running)", "Status: \"", fmt.Sprintf("%d pods", 4)} {
		if !strings.Contains(status, want) {
			n.t.Errorf("systemctl status noderun: no %q in\n%s", want, status)
		}
	}
}

// watchdog: a noderun that stops feeding the watchdog (SIGSTOP) is
// restarted by systemd (WatchdogSec=60, then the abort's timeout), and the
// next one adopts the pods untouched.
func watchdog(n *node) {
	pids := map[string]string{}
	for _, p := range qos {
		pids[p.name] = n.pid("sleep " + p.marker)
	}
	main := strings.TrimSpace(n.sh("systemctl show -P MainPID noderun"))
	n.sh("kill -STOP " + main)
	n.waitPods("a new noderun answering after the watchdog", func(map[string]v1.Pod) bool {
		now, err := n.try("systemctl show -P MainPID noderun")
		now = strings.TrimSpace(now)
		return err == nil && now != main && now != "0"
	})
	if out := n.sh("journalctl -u noderun --no-pager | grep -c 'Watchdog timeout' || true"); strings.TrimSpace(out) == "0" {
		n.t.Errorf("no 'Watchdog timeout' in noderun's journal")
	}
	n.waitPods("the QoS pods running after the watchdog's restart", running("guaranteed", "burstable", "besteffort"))
	for _, p := range qos {
		if got := n.pid("sleep " + p.marker); got != pids[p.name] {
			n.t.Errorf("%s: after the watchdog's restart the container's PID is %s, was %s", p.name, got, pids[p.name])
		}
	}
}

// resetAndRemove: systemctl stop and noderun reset --images leave the
// machine as it was before noderun's first start; apt remove then takes
// the binary and the unit.
func resetAndRemove(n *node) {
	n.sh("systemctl stop noderun")
	// With the daemon's settings, as docs/operating.md says: the unit's
	// EnvironmentFile holds the driver.
	n.sh("set -a; . /etc/noderun/env; noderun reset --images")
	if after := n.sh(hostState); after != n.before {
		n.t.Errorf("after noderun reset the machine differs from before the first start:\n%s", lineDiff(n.before, after))
	}
	n.sh("DEBIAN_FRONTEND=noninteractive apt-get remove -y -q noderun")
	if out, err := n.try("ls /usr/bin/noderun /lib/systemd/system/noderun.service"); err == nil {
		n.t.Errorf("after apt remove: %s", out)
	}
	if out, err := n.try("systemctl daemon-reload && systemctl cat noderun.service"); err == nil {
		n.t.Errorf("systemd still knows noderun.service after apt remove:\n%s", out)
	}
}

// lineDiff lists the lines only one of a and b has.
func lineDiff(a, b string) string {
	count := map[string]int{}
	for _, l := range strings.Split(a, "\n") {
		count[l]--
	}
	for _, l := range strings.Split(b, "\n") {
		count[l]++
	}
	var out []string
	for l, c := range count {
		switch {
		case c < 0:
			out = append(out, "- "+l)
		case c > 0:
			out = append(out, "+ "+l)
		}
	}
	slices.Sort(out)
	return strings.Join(out, "\n")
}
