package podstats

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/noderun/noderun/internal/cgroups"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"
)

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// fakeNode is a cgroup v2 tree and a /proc with one pod of one container.
type fakeNode struct {
	t             *testing.T
	cg            cgroups.Layout
	proc, logs    string
	pod           Pod
	podDir, ctDir string
}

const netDev = `Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:     100       1    0    0    0     0          0         0      100       1    0    0    0     0       0          0
  eth0:    5000      50    1    2    0     0          0         0     7000      70    3    4    0     0       0          0
`

func newFakeNode(t *testing.T) *fakeNode {
	root := t.TempDir()
	n := &fakeNode{t: t, cg: cgroups.Layout{Driver: cgroups.Cgroupfs, Unified: true, FS: filepath.Join(root, "cg")},
		proc: filepath.Join(root, "proc"), logs: filepath.Join(root, "logs")}
	parent := n.cg.PodParent(cgroups.Burstable, "sb")
	n.pod = Pod{Name: "web", Namespace: "default", UID: "u1", Cgroup: parent, LogDir: n.logs,
		StartTime:  time.Unix(1000, 0),
		Containers: []Container{{Name: "app", ID: "c1", Image: "busybox", Cgroup: n.cg.ContainerPath(parent, "c1"), StartTime: time.Unix(1001, 0)}}}
	n.podDir, n.ctDir = n.cg.Dir(parent, ""), n.cg.Dir(n.pod.Containers[0].Cgroup, "")
	n.setCPU(0)
	for _, d := range []string{n.podDir, n.ctDir} {
		write(t, filepath.Join(d, "memory.current"), "104857600\n")
		write(t, filepath.Join(d, "memory.stat"), "anon 60000\nfile 1000\ninactive_file 20971520\n")
		write(t, filepath.Join(d, "memory.max"), "max\n")
	}
	write(t, filepath.Join(n.ctDir, "cgroup.procs"), "42\n")
	write(t, filepath.Join(n.cg.FS, "cpu.stat"), "usage_usec 0\n")
	write(t, filepath.Join(n.proc, "meminfo"), "MemTotal: 1048576 kB\nMemFree: 524288 kB\nInactive(file): 0 kB\n")
	write(t, filepath.Join(n.proc, "stat"), "cpu 1 2 3\nbtime 1700000000\n")
	write(t, filepath.Join(n.proc, "net", "dev"), netDev)
	write(t, filepath.Join(n.proc, "42", "net", "dev"), netDev)
	write(t, filepath.Join(n.proc, "sys", "kernel", "pid_max"), "4194304\n")
	write(t, filepath.Join(n.logs, "app", "0.log"), strings.Repeat("x", 5000))
	return n
}

// setCPU sets the pod's and the container's cumulative CPU time.
func (n *fakeNode) setCPU(d time.Duration) {
	for _, dir := range []string{n.podDir, n.ctDir} {
		write(n.t, filepath.Join(dir, "cpu.stat"), fmt.Sprintf("usage_usec %d\nuser_usec 0\nsystem_usec 0\n", d.Microseconds()))
	}
}

func (n *fakeNode) collector(clk *clocktesting.FakeClock) *Collector {
	return New(Config{NodeName: "node1", Pods: func() []Pod { return []Pod{n.pod} }, Cgroups: n.cg,
		NodeDir: n.logs, Clock: clk, ProcDir: n.proc})
}

// snapshotStepping takes a snapshot while the fake clock is stepped by
// firstWindow whenever the collector waits on it, after during.
func snapshotStepping(t *testing.T, c *Collector, clk *clocktesting.FakeClock, during func()) *Snapshot {
	t.Helper()
	type res struct {
		s   *Snapshot
		err error
	}
	done := make(chan res, 1)
	go func() {
		s, err := c.Snapshot(context.Background())
		done <- res{s, err}
	}()
	for {
		select {
		case r := <-done:
			if r.err != nil {
				t.Fatal(r.err)
			}
			return r.s
		case <-time.After(time.Millisecond):
			if clk.HasWaiters() {
				during()
				clk.Step(firstWindow)
			}
		}
	}
}

// The first request waits one window for a second sample; the next within
// cacheFor is the same collection; a later one takes its rate from the
// last sample, without waiting; a sample older than maxWindow is not used.
func TestCPURateWindows(t *testing.T) {
	n := newFakeNode(t)
	clk := clocktesting.NewFakeClock(time.Unix(2000, 0))
	c := n.collector(clk)
	waited := false
	s := snapshotStepping(t, c, clk, func() { waited = true; n.setCPU(500 * time.Millisecond) })
	if !waited {
		t.Fatal("the first collection did not wait for a window")
	}
	ct := s.Summary.Pods[0].Containers[0]
	if got := *ct.CPU.UsageNanoCores; got != 5e8 || s.Pods[0].Containers[0].Window != firstWindow {
		t.Errorf("first rate %d over %v, want 0.5 cores over %v", got, s.Pods[0].Containers[0].Window, firstWindow)
	}
	if again, _ := c.Snapshot(context.Background()); again != s {
		t.Error("a request within cacheFor collected again")
	}
	clk.Step(10 * time.Second)
	n.setCPU(2500 * time.Millisecond)
	s = snapshotStepping(t, c, clk, func() { t.Error("waited although a recent sample exists") })
	if got := *s.Summary.Pods[0].CPU.UsageNanoCores; got != 2e8 || s.Pods[0].Window != 10*time.Second {
		t.Errorf("second rate %d over %v, want 0.2 cores over 10s", got, s.Pods[0].Window)
	}
	clk.Step(maxWindow + time.Second)
	waited = false
	s = snapshotStepping(t, c, clk, func() { waited = true })
	if !waited || *s.Summary.Pods[0].CPU.UsageNanoCores != 0 || s.Pods[0].Window != firstWindow {
		t.Errorf("after maxWindow: waited %v, rate %d over %v", waited, *s.Summary.Pods[0].CPU.UsageNanoCores, s.Pods[0].Window)
	}
}

// The Summary carries the kubelet's figures: working set, network of the
// pod's namespace (eth0 inline, no loopback), log usage, and its JSON
// names.
func TestSummaryShape(t *testing.T) {
	n := newFakeNode(t)
	clk := clocktesting.NewFakeClock(time.Unix(2000, 0))
	s := snapshotStepping(t, n.collector(clk), clk, func() {})
	p := s.Summary.Pods[0]
	if p.PodRef != (PodReference{"web", "default", "u1"}) || p.Containers[0].Name != "app" {
		t.Fatalf("pod %+v", p.PodRef)
	}
	if ws := *p.Containers[0].Memory.WorkingSetBytes; ws != 80<<20 {
		t.Errorf("working set %d, want 80 MiB", ws)
	}
	if p.Network == nil || p.Network.Name != "eth0" || *p.Network.RxBytes != 5000 || len(p.Network.Interfaces) != 1 {
		t.Errorf("network %+v", p.Network)
	}
	if used := *p.Containers[0].Logs.UsedBytes; used < 5000 {
		t.Errorf("logs use %d bytes, want ≥ 5000", used)
	}
	if s.Summary.Node.NodeName != "node1" || *s.Summary.Node.Memory.WorkingSetBytes != 512<<20 ||
		*s.Summary.Node.Memory.AvailableBytes != 512<<20 || s.Summary.Node.StartTime.Unix() != 1700000000 {
		t.Errorf("node %+v memory %+v", s.Summary.Node, s.Summary.Node.Memory)
	}
	b, err := json.Marshal(s.Summary)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{`"podRef":`, `"workingSetBytes":`, `"usageNanoCores":`, `"usageCoreNanoSeconds":`,
		`"rxBytes":`, `"interfaces":`, `"ephemeral-storage":`, `"logs":`, `"nodeName":`} {
		if !strings.Contains(string(b), key) {
			t.Errorf("summary JSON lacks %s", key)
		}
	}
}

// A container's rootfs is its writable layer as the runtime reports it, on
// the filesystem it names, and counts in the pod's ephemeral storage with
// its logs, as the kubelet's calcEphemeralStorage sums them.
func TestSummaryRootfs(t *testing.T) {
	n := newFakeNode(t)
	clk := clocktesting.NewFakeClock(time.Unix(2000, 0))
	c := n.collector(clk)
	c.cfg.WritableLayer = func(_ context.Context, id string) (uint64, uint64, string, error) {
		if id != "c1" {
			t.Errorf("writable layer of %q, want c1", id)
		}
		return 1 << 20, 7, n.logs, nil
	}
	p := snapshotStepping(t, c, clk, func() {}).Summary.Pods[0]
	ct := p.Containers[0]
	if ct.Rootfs == nil || *ct.Rootfs.UsedBytes != 1<<20 || *ct.Rootfs.InodesUsed != 7 || ct.Rootfs.CapacityBytes == nil || *ct.Rootfs.CapacityBytes == 0 {
		t.Fatalf("rootfs %+v, want 1 MiB and 7 inodes used on a filesystem with a capacity", ct.Rootfs)
	}
	if e := p.EphemeralStorage; *e.UsedBytes != *ct.Logs.UsedBytes+1<<20 || *e.InodesUsed != *ct.Logs.InodesUsed+7 {
		t.Errorf("ephemeral storage %d bytes %d inodes, want the logs' plus the rootfs' (%d+%d, %d+7)",
			*e.UsedBytes, *e.InodesUsed, *ct.Logs.UsedBytes, 1<<20, *ct.Logs.InodesUsed)
	}
}

// The series have the kubelet's names and labels.
func TestMetricNames(t *testing.T) {
	n := newFakeNode(t)
	clk := clocktesting.NewFakeClock(time.Unix(2000, 0))
	s := snapshotStepping(t, n.collector(clk), clk, func() {})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(resourceMetrics{s, nil})
	want := `# HELP container_memory_working_set_bytes Current working set of the container in bytes
# TYPE container_memory_working_set_bytes gauge
container_memory_working_set_bytes{container="app",namespace="default",pod="web"} 8.388608e+07 2001000
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "container_memory_working_set_bytes"); err != nil {
		t.Error(err)
	}
	reg = prometheus.NewPedanticRegistry()
	reg.MustRegister(cadvisor{s, nil, n.cg})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, mf := range mfs {
		got[mf.GetName()] = true
	}
	for _, name := range []string{"container_cpu_usage_seconds_total", "container_memory_working_set_bytes",
		"container_start_time_seconds", "container_network_receive_bytes_total"} {
		if !got[name] {
			t.Errorf("/metrics/cadvisor lacks %s", name)
		}
	}
}
