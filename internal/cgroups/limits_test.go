package cgroups

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	sddbus "github.com/coreos/go-systemd/v22/dbus"

	"github.com/noderun/noderun/internal/testenv"
)

func readValue(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	return string(b)
}

var guaranteed = PodResources{CPUShares: 102, CPUQuota: 10000, CPUPeriod: 100000, Memory: 100 << 20}

// On a cgroupfs v1 tree (faked by plain dirs) the pod's values go in the
// cpu and memory hierarchies' files, and the QoS parents' shares beside.
func TestEnsureCgroupfsV1(t *testing.T) {
	fs := t.TempDir()
	l := Layout{Driver: Cgroupfs, FS: fs}
	ctx := context.Background()
	if err := l.UpdateQoS(ctx, 1536); err != nil {
		t.Fatal(err)
	}
	if err := l.EnsurePod(ctx, l.PodParent(Guaranteed, sandbox), guaranteed); err != nil {
		t.Fatal(err)
	}
	if err := l.EnsurePod(ctx, l.PodParent(BestEffort, sandbox), PodResources{CPUShares: 2}); err != nil {
		t.Fatal(err)
	}
	pod := "noderun/pod" + sandbox
	for file, want := range map[string]string{
		"cpu/noderun/burstable/cpu.shares":                     "1536",
		"cpu/noderun/besteffort/cpu.shares":                    "2",
		"cpu/" + pod + "/cpu.shares":                           "102",
		"cpu/" + pod + "/cpu.cfs_period_us":                    "100000",
		"cpu/" + pod + "/cpu.cfs_quota_us":                     "10000",
		"memory/" + pod + "/memory.limit_in_bytes":             "104857600",
		"cpu/noderun/besteffort/pod" + sandbox + "/cpu.shares": "2",
	} {
		if got := readValue(t, filepath.Join(fs, file)); got != want {
			t.Errorf("%s = %s, want %s", file, got, want)
		}
	}
	// No limit: the files keep the kernel's "unlimited".
	for _, file := range []string{"cpu/noderun/besteffort/pod" + sandbox + "/cpu.cfs_quota_us", "memory/noderun/besteffort/pod" + sandbox} {
		if _, err := os.Stat(filepath.Join(fs, file)); !os.IsNotExist(err) {
			t.Errorf("%s written for a BestEffort pod (%v)", file, err)
		}
	}
}

// On v2 each level gets cpu, memory and pids enabled for its children
// (those its cgroup.controllers has), and the values in v2's files:
// cpu.weight by the kubelet's conversion, cpu.max, memory.max.
func TestEnsureCgroupfsV2(t *testing.T) {
	fs := t.TempDir()
	if err := os.WriteFile(filepath.Join(fs, "cgroup.controllers"), []byte("cpuset cpu io memory hugetlb pids rdma\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	l := Layout{Driver: Cgroupfs, Unified: true, FS: fs}
	ctx := context.Background()
	if err := l.UpdateQoS(ctx, 1536); err != nil {
		t.Fatal(err)
	}
	if err := l.EnsurePod(ctx, l.PodParent(Burstable, sandbox), PodResources{CPUShares: 512, CPUQuota: 50000, CPUPeriod: 100000}); err != nil {
		t.Fatal(err)
	}
	pod := "noderun/burstable/pod" + sandbox
	for file, want := range map[string]string{
		"cgroup.subtree_control":        "+cpu +memory +hugetlb +pids",
		"noderun/burstable/cpu.weight":  "59", // 1 + (1536-2)*9999/262142
		"noderun/besteffort/cpu.weight": "1",
		pod + "/cpu.weight":             "20",
		pod + "/cpu.max":                "50000 100000",
	} {
		if got := readValue(t, filepath.Join(fs, file)); got != want {
			t.Errorf("%s = %s, want %s", file, got, want)
		}
	}
	if _, err := os.Stat(filepath.Join(fs, pod, "memory.max")); !os.IsNotExist(err) {
		t.Errorf("memory.max written without a memory limit (%v)", err)
	}
}

func TestSharesToWeight(t *testing.T) {
	for shares, want := range map[uint64]uint64{0: 1, 2: 1, 102: 4, 1024: 39, 262144: 10000, 300000: 10000} {
		if got := SharesToWeight(shares); got != want {
			t.Errorf("SharesToWeight(%d) = %d, want %d", shares, got, want)
		}
	}
}

// With systemd the QoS parents and the pod are slices whose properties
// systemd writes: v1's CPUShares and MemoryLimit, v2's CPUWeight and
// MemoryMax, the quota per second rounded up to 10 ms.
func TestEnsureSystemdSlices(t *testing.T) {
	for _, unified := range []bool{false, true} {
		var calls []string
		l := Layout{Driver: Systemd, Unified: unified, SetSlice: func(_ context.Context, name string, props []sddbus.Property) error {
			var ps []string
			for _, p := range props {
				ps = append(ps, fmt.Sprintf("%s=%v", p.Name, p.Value.Value()))
			}
			calls = append(calls, name+" "+strings.Join(ps, " "))
			return nil
		}}
		ctx := context.Background()
		if err := l.UpdateQoS(ctx, 1536); err != nil {
			t.Fatal(err)
		}
		r := PodResources{CPUShares: 102, CPUQuota: 15000, CPUPeriod: 100000, Memory: 100 << 20}
		if err := l.EnsurePod(ctx, l.PodParent(Guaranteed, sandbox), r); err != nil {
			t.Fatal(err)
		}
		acct := "CPUAccounting=true MemoryAccounting=true "
		want := []string{
			"noderun-besteffort.slice " + acct + "CPUShares=2",
			"noderun-burstable.slice " + acct + "CPUShares=1536",
			"noderun-pod" + sandbox + ".slice " + acct + "CPUShares=102 CPUQuotaPerSecUSec=150000 MemoryLimit=104857600",
		}
		if unified {
			want = []string{
				"noderun-besteffort.slice " + acct + "CPUWeight=1",
				"noderun-burstable.slice " + acct + "CPUWeight=59",
				"noderun-pod" + sandbox + ".slice " + acct + "CPUWeight=4 CPUQuotaPerSecUSec=150000 MemoryMax=104857600",
			}
		}
		if !slices.Equal(calls, want) {
			t.Errorf("unified %t:\n got %q\nwant %q", unified, calls, want)
		}
	}
	if got := sliceProperties(PodResources{CPUShares: 2, CPUQuota: 1000, CPUPeriod: 100000}, true)[3]; got.Value.Value() != uint64(10000) {
		t.Errorf("1 ms per 100 ms: %s %v, want CPUQuotaPerSecUSec 10000", got.Name, got.Value)
	}
}

// The swap controller is looked for as the kubelet looks: the v1 memory
// root's memory.memsw.limit_in_bytes (swapaccount), memory.swap.max in
// this process's own v2 cgroup.
func TestSwapControl(t *testing.T) {
	fs := t.TempDir()
	v1, v2 := Layout{FS: fs}, Layout{FS: fs, Unified: true}
	if v1.SwapControl() || v2.SwapControl() {
		t.Fatal("swap control without the files")
	}
	memsw := filepath.Join(fs, "memory", "memory.memsw.limit_in_bytes")
	if err := os.MkdirAll(filepath.Dir(memsw), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(memsw, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if !v1.SwapControl() {
		t.Error("v1: memory.memsw.limit_in_bytes not found")
	}
	swapMax := filepath.Join(fs, ownCgroup(), "memory.swap.max")
	if err := os.MkdirAll(filepath.Dir(swapMax), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(swapMax, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if !v2.SwapControl() {
		t.Errorf("v2: %s not found", swapMax)
	}
}

// reset stops the QoS slices once no pod slice is left in them, then the
// root's.
func TestSystemdRemovesQoSSlices(t *testing.T) {
	var stopped []string
	fs := t.TempDir()
	l := Layout{Driver: Systemd, Unified: true, FS: fs, StopUnit: func(_ context.Context, name string) error {
		stopped = append(stopped, name)
		return os.Remove(filepath.Join(fs, expandSlice(name)))
	}}
	cgroupMounts = func() []string { return []string{fs} }
	t.Cleanup(func() { cgroupMounts = readCgroupMounts })
	pod := filepath.Join(fs, expandSlice(l.PodParent(Burstable, sandbox)))
	for _, d := range []string{pod, filepath.Join(fs, expandSlice(l.tierPath(BestEffort)))} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	if err := l.RemoveRoot(ctx); err != nil {
		t.Fatal(err)
	}
	if want := []string{"noderun-besteffort.slice"}; !slices.Equal(stopped, want) {
		t.Fatalf("with a burstable pod left: stopped %q, want %q", stopped, want)
	}
	if err := os.Remove(pod); err != nil {
		t.Fatal(err)
	}
	if err := l.RemoveRoot(ctx); err != nil {
		t.Fatal(err)
	}
	if want := []string{"noderun-besteffort.slice", "noderun-burstable.slice", "noderun.slice"}; !slices.Equal(stopped, want) {
		t.Fatalf("stopped %q, want %q", stopped, want)
	}
}

// On this host's own hierarchy (a root of the test's own): the kernel
// takes the values, and reset's removal leaves nothing.
func TestEnsureOnHost(t *testing.T) {
	if testing.Short() {
		t.Skip("makes cgroups; skipped with -short")
	}
	testenv.Require(t, os.Geteuid() == 0, "root")
	l := Detect(Cgroupfs)
	l.Root = "noderun_test_" + filepath.Base(t.TempDir())
	ctx := context.Background()
	t.Cleanup(func() {
		_ = l.RemovePod(ctx, l.PodParent(Guaranteed, sandbox))
		_ = l.RemoveRoot(ctx)
	})
	if err := l.UpdateQoS(ctx, 1536); err != nil {
		t.Fatal(err)
	}
	parent := l.PodParent(Guaranteed, sandbox)
	if err := l.EnsurePod(ctx, parent, guaranteed); err != nil {
		t.Fatal(err)
	}
	if err := l.EnsurePod(ctx, parent, guaranteed); err != nil {
		t.Fatalf("again, as after a restart: %v", err)
	}
	files := map[string]string{
		filepath.Join(l.Dir(parent, "cpu"), "cpu.shares"):                "102\n",
		filepath.Join(l.Dir(parent, "cpu"), "cpu.cfs_quota_us"):          "10000\n",
		filepath.Join(l.Dir(parent, "memory"), "memory.limit_in_bytes"):  "104857600\n",
		filepath.Join(l.Dir(l.tierPath(Burstable), "cpu"), "cpu.shares"): "1536\n",
	}
	if l.Unified {
		files = map[string]string{
			filepath.Join(l.Dir(parent, ""), "cpu.weight"): "4\n",
			filepath.Join(l.Dir(parent, ""), "cpu.max"):    "10000 100000\n",
			filepath.Join(l.Dir(parent, ""), "memory.max"): "104857600\n",
		}
	}
	for file, want := range files {
		if got := readValue(t, file); got != want {
			t.Errorf("%s = %q, want %q", file, got, want)
		}
	}
	if err := l.RemovePod(ctx, parent); err != nil {
		t.Fatal(err)
	}
	if err := l.RemoveRoot(ctx); err != nil {
		t.Fatal(err)
	}
	for _, h := range l.hierarchies() {
		if _, err := os.Stat(filepath.Join(h, l.Root)); !os.IsNotExist(err) {
			t.Errorf("%s left (%v)", filepath.Join(h, l.Root), err)
		}
	}
}

// fakeHugePages gives the host the kernel's huge page pools named.
func fakeHugePages(t *testing.T, pools ...string) {
	d := t.TempDir()
	for _, n := range pools {
		if err := os.Mkdir(filepath.Join(d, n), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	old := hugePagesDir
	hugePagesDir = d
	t.Cleanup(func() { hugePagesDir = old })
}

func TestHugePageSizes(t *testing.T) {
	fakeHugePages(t, "hugepages-64kB", "hugepages-2048kB", "hugepages-32768kB", "hugepages-1048576kB", "hugepages-16777216kB", "other")
	got := hugePageSizes()
	slices.Sort(got)
	if want := []string{"16GB", "1GB", "2MB", "32MB", "64KB"}; !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

// A pod's cgroup limits every huge page size to 0 where the hugetlb
// controller is (its v1 hierarchy, enabled for the pod's v2 parent), as
// the kubelet limits the sizes a pod does not request; the QoS parents
// are left unlimited.
func TestEnsureLimitsHugePages(t *testing.T) {
	fakeHugePages(t, "hugepages-2048kB", "hugepages-1048576kB")
	ctx := context.Background()
	fs := t.TempDir()
	l := Layout{Driver: Cgroupfs, FS: fs}
	if err := os.Mkdir(filepath.Join(fs, "hugetlb"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := l.UpdateQoS(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if err := l.EnsurePod(ctx, l.PodParent(Burstable, sandbox), PodResources{CPUShares: 2}); err != nil {
		t.Fatal(err)
	}
	for _, size := range []string{"2MB", "1GB"} {
		if got := readValue(t, filepath.Join(fs, "hugetlb/noderun/burstable/pod"+sandbox, "hugetlb."+size+".limit_in_bytes")); got != "0" {
			t.Errorf("v1 %s: %s, want 0", size, got)
		}
	}
	if _, err := os.Stat(filepath.Join(fs, "hugetlb/noderun/burstable/hugetlb.2MB.limit_in_bytes")); !os.IsNotExist(err) {
		t.Errorf("v1: the burstable parent got a huge page limit (%v)", err)
	}

	fs = t.TempDir()
	l = Layout{Driver: Cgroupfs, Unified: true, FS: fs}
	tier := filepath.Join(fs, "noderun", "burstable")
	if err := os.MkdirAll(tier, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tier, "cgroup.subtree_control"), []byte("cpu memory hugetlb pids\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := l.EnsurePod(ctx, l.PodParent(Burstable, sandbox), PodResources{CPUShares: 2}); err != nil {
		t.Fatal(err)
	}
	for _, size := range []string{"2MB", "1GB"} {
		if got := readValue(t, filepath.Join(tier, "pod"+sandbox, "hugetlb."+size+".max")); got != "0" {
			t.Errorf("v2 %s: %s, want 0", size, got)
		}
	}
}
