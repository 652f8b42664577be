package containerd

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/containerd/cgroups/v3/cgroup2"
	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/internal/cgroups"
	"github.com/noderun/noderun/runner"
)

// genSpec applies opts to containerd's default spec, without a daemon.
func genSpec(t *testing.T, opts ...oci.SpecOpts) *oci.Spec {
	t.Helper()
	ctx := namespaces.WithNamespace(context.Background(), "test")
	s, err := oci.GenerateSpec(ctx, nil, &containers.Container{ID: "c1"}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func nsPaths(s *oci.Spec) map[specs.LinuxNamespaceType]string {
	out := map[specs.LinuxNamespaceType]string{}
	for _, ns := range s.Linux.Namespaces {
		out[ns.Type] = ns.Path
	}
	return out
}

func TestWithSandboxNamespaces(t *testing.T) {
	sb := &runner.Sandbox{Dir: "/run/noderun/pods/abc"}
	got := nsPaths(genSpec(t, withSandboxNamespaces(sb)))
	want := map[specs.LinuxNamespaceType]string{
		specs.NetworkNamespace: "/run/noderun/pods/abc/net", specs.IPCNamespace: "/run/noderun/pods/abc/ipc",
		specs.UTSNamespace: "/run/noderun/pods/abc/uts", specs.PIDNamespace: "", specs.MountNamespace: "",
	}
	for k, v := range want {
		if p, ok := got[k]; !ok || p != v {
			t.Errorf("namespace %s: path %q (present %v), want %q", k, p, ok, v)
		}
	}
	sb.HostNetwork = true
	got = nsPaths(genSpec(t, withSandboxNamespaces(sb)))
	if _, ok := got[specs.NetworkNamespace]; ok {
		t.Error("hostNetwork pod must not get a network namespace")
	}
	if _, ok := got[specs.UTSNamespace]; ok {
		t.Error("hostNetwork pod must share the host's UTS namespace")
	}
	if got[specs.IPCNamespace] != "/run/noderun/pods/abc/ipc" {
		t.Error("hostNetwork pod still shares the pod's IPC namespace")
	}
}

func TestWithMountsReplacesDefaults(t *testing.T) {
	s := genSpec(t, withMounts([]runner.Mount{
		{Source: "/state/hosts", Destination: "/etc/hosts"},
		{Source: "/data", Destination: "/dev/shm", ReadOnly: true},
	}, readMountinfo))
	var shm []specs.Mount
	for _, m := range s.Mounts {
		if m.Destination == "/dev/shm" {
			shm = append(shm, m)
		}
	}
	if len(shm) != 1 || shm[0].Source != "/data" || !slices.Contains(shm[0].Options, "ro") {
		t.Fatalf("/dev/shm mounts = %+v; want only the volume, read-only", shm)
	}
}

// A recursive read-only mount carries runc's rro beside ro, as containerd's
// CRI hands it.
func TestWithMountsRecursiveReadOnly(t *testing.T) {
	s := genSpec(t, withMounts([]runner.Mount{
		{Source: "/data", Destination: "/rro", ReadOnly: true, RecursiveReadOnly: true},
		{Source: "/data", Destination: "/ro", ReadOnly: true},
	}, readMountinfo))
	for _, m := range s.Mounts {
		if want := m.Destination == "/rro"; (m.Destination == "/rro" || m.Destination == "/ro") && slices.Contains(m.Options, "rro") != want {
			t.Errorf("%s: options %v", m.Destination, m.Options)
		}
	}
}

func TestWithOOMScoreAdjClampsToFloor(t *testing.T) {
	for _, tc := range []struct{ want, own, got int }{{-997, 0, 0}, {1000, 0, 1000}, {500, 600, 600}} {
		s := genSpec(t, withOOMScoreAdj(tc.want, tc.own))
		if *s.Process.OOMScoreAdj != tc.got {
			t.Errorf("want %d own %d: got %d, expected %d", tc.want, tc.own, *s.Process.OOMScoreAdj, tc.got)
		}
	}
}

// The floor is -1000 only with CAP_SYS_RESOURCE (bit 24 of CapEff); this
// host's container lacks it (000001fffeffffff), so there it is noderun's own.
func TestOOMScoreFloor(t *testing.T) {
	for _, tc := range []struct {
		capEff    string
		own, want int
	}{
		{"000001ffffffffff", 0, -1000},
		{"000001fffeffffff", 0, 0},
		{"000001fffeffffff", -500, -500},
		{"garbage", 100, 100},
	} {
		status := "Name:\tnoderun\nCapPrm:\t000001ffffffffff\nCapEff:\t" + tc.capEff + "\nCapBnd:\t0\n"
		if got := oomScoreFloor(status, tc.own); got != tc.want {
			t.Errorf("CapEff %s, own %d: floor %d, want %d", tc.capEff, tc.own, got, tc.want)
		}
	}
}

func TestWithResources(t *testing.T) {
	res := genSpec(t, withResources(runner.Resources{CPUShares: 256, CPUQuota: 50000, CPUPeriod: 100000, MemoryLimit: 64 << 20}, false)).Linux.Resources
	if *res.CPU.Shares != 256 || *res.CPU.Quota != 50000 || *res.CPU.Period != 100000 {
		t.Errorf("cpu shares/quota/period = %d/%d/%d, want 256/50000/100000", *res.CPU.Shares, *res.CPU.Quota, *res.CPU.Period)
	}
	if *res.Memory.Limit != 64<<20 {
		t.Errorf("memory limit %d, want %d", *res.Memory.Limit, 64<<20)
	}
	if res.Memory.Swap != nil {
		t.Errorf("swap %d without NoSwap (a host without the swap controller)", *res.Memory.Swap)
	}
	best := genSpec(t, withResources(runner.Resources{CPUShares: 2}, false)).Linux.Resources
	if *best.CPU.Shares != 2 || best.CPU.Quota != nil || best.Memory != nil {
		t.Errorf("BestEffort: shares %d quota %v memory %v; want 2, none, none", *best.CPU.Shares, best.CPU.Quota, best.Memory)
	}
}

// NoSwap as the kubelet sets it: on v1 memory+swap equal to the limit and
// nothing without a limit (the kubelet's 0 means unset); on v2
// memory.swap.max 0 with or without one.
func TestWithResourcesNoSwap(t *testing.T) {
	limited := runner.Resources{CPUShares: 2, MemoryLimit: 64 << 20, NoSwap: true}
	v1res := genSpec(t, withResources(limited, false)).Linux.Resources
	if v1res.Memory.Swap == nil || *v1res.Memory.Swap != 64<<20 || v1res.Unified != nil {
		t.Errorf("v1 limited: swap %v unified %v; want %d, none", v1res.Memory.Swap, v1res.Unified, 64<<20)
	}
	if r := genSpec(t, withResources(runner.Resources{CPUShares: 2, NoSwap: true}, false)).Linux.Resources; r.Memory != nil || r.Unified != nil {
		t.Errorf("v1 unlimited: memory %+v unified %v; want none", r.Memory, r.Unified)
	}
	for _, r := range []runner.Resources{limited, {CPUShares: 2, NoSwap: true}} {
		v2res := genSpec(t, withResources(r, true)).Linux.Resources
		if v2res.Unified["memory.swap.max"] != "0" || (v2res.Memory != nil && v2res.Memory.Swap != nil) {
			t.Errorf("v2 (limit %d): unified %v; want memory.swap.max 0 and no v1 swap", r.MemoryLimit, v2res.Unified)
		}
	}
}

// LimitedSwap (v2 only) writes the container's share into memory.swap.max.
func TestWithResourcesLimitedSwap(t *testing.T) {
	r := runner.Resources{CPUShares: 2, MemoryLimit: 256 << 20, LimitedSwap: true, SwapMax: 12345}
	res := genSpec(t, withResources(r, true)).Linux.Resources
	if res.Unified["memory.swap.max"] != "12345" || res.Memory.Swap != nil {
		t.Errorf("unified %v swap %v; want memory.swap.max 12345 and no v1 swap", res.Unified, res.Memory.Swap)
	}
}

func TestRepoDigest(t *testing.T) {
	for in, want := range map[string]string{
		"docker.io/library/busybox:1.36":       "docker.io/library/busybox@sha256:ab",
		"127.0.0.1:5000/app:v1":                "127.0.0.1:5000/app@sha256:ab",
		"127.0.0.1:5000/app":                   "127.0.0.1:5000/app@sha256:ab",
		"docker.io/library/busybox@sha256:old": "docker.io/library/busybox@sha256:ab",
	} {
		if got := repoDigest(in, "sha256:ab"); got != want {
			t.Errorf("repoDigest(%q) = %q, want %q", in, got, want)
		}
	}
}

// containerd's default spec caps open files at 1024; CRI removes that so a
// container gets the shim's limits, and so must noderun.
func TestWithoutDefaultRlimits(t *testing.T) {
	if s := genSpec(t); len(s.Process.Rlimits) == 0 {
		t.Fatal("containerd's default spec has no rlimits: the option under test is moot")
	}
	if s := genSpec(t, withoutDefaultRlimits); len(s.Process.Rlimits) != 0 {
		t.Errorf("rlimits = %+v, want none", s.Process.Rlimits)
	}
}

func TestWithSandboxNamespacesHost(t *testing.T) {
	sb := &runner.Sandbox{Dir: "/run/noderun/pods/abc", HostPID: true, HostIPC: true}
	got := nsPaths(genSpec(t, withSandboxNamespaces(sb)))
	if _, ok := got[specs.PIDNamespace]; ok {
		t.Errorf("hostPID: the spec still has a PID namespace: %v", got)
	}
	if _, ok := got[specs.IPCNamespace]; ok {
		t.Errorf("hostIPC: the spec still has an IPC namespace: %v", got)
	}
	if got[specs.NetworkNamespace] != sb.NetNSPath() {
		t.Errorf("network namespace = %q, want the pod's", got[specs.NetworkNamespace])
	}
	sb.HostPID, sb.HostIPC = false, false
	got = nsPaths(genSpec(t, withSandboxNamespaces(sb)))
	if p, ok := got[specs.PIDNamespace]; !ok || p != "" {
		t.Errorf("PID namespace = %q (present %v), want a new one per container", p, ok)
	}
	if got[specs.IPCNamespace] != sb.IPCNSPath() {
		t.Errorf("IPC namespace = %q, want the pod's", got[specs.IPCNamespace])
	}
}

func TestWithMountsPropagation(t *testing.T) {
	infos := func() []mountInfo {
		return []mountInfo{{point: "/", shared: true}, {point: "/private"}, {point: "/slave", slave: true}}
	}
	for _, tc := range []struct {
		src      string
		prop     v1.MountPropagationMode
		wantOpt  string
		wantRoot string
		wantErr  bool
	}{
		{"/data", v1.MountPropagationNone, "rprivate", "", false},
		{"/data", v1.MountPropagationHostToContainer, "rslave", "rslave", false},
		{"/slave/x", v1.MountPropagationHostToContainer, "rslave", "rslave", false},
		{"/data", v1.MountPropagationBidirectional, "rshared", "rshared", false},
		{"/private/x", v1.MountPropagationHostToContainer, "", "", true},
		{"/slave/x", v1.MountPropagationBidirectional, "", "", true},
	} {
		ctx := namespaces.WithNamespace(context.Background(), "test")
		s, err := oci.GenerateSpec(ctx, nil, &containers.Container{ID: "c1"},
			withMounts([]runner.Mount{{Source: tc.src, Destination: "/v", Propagation: tc.prop}}, infos))
		if tc.wantErr {
			if !errors.Is(err, runner.ErrContainerConfig) {
				t.Errorf("%s %s: err %v, want a config error", tc.src, tc.prop, err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		var m specs.Mount
		for _, x := range s.Mounts {
			if x.Destination == "/v" {
				m = x
			}
		}
		if !slices.Contains(m.Options, tc.wantOpt) || s.Linux.RootfsPropagation != tc.wantRoot {
			t.Errorf("%s %s: options %v root %q, want %s and root %q", tc.src, tc.prop, m.Options, s.Linux.RootfsPropagation, tc.wantOpt, tc.wantRoot)
		}
	}
}

// The spec and runc's options are right for both cgroup drivers on both
// hierarchies: the cgroupsPath's form, SystemdCgroup, and resources that
// come out on v2 as the kubelet's do (containerd's own v1-to-v2 conversion,
// the one runc applies too).
func TestCgroupSpecPerLayout(t *testing.T) {
	const sandbox = "0123456789abcdef0123456789abcdef"
	for _, tc := range []struct {
		name        string
		layout      cgroups.Layout
		cgroupsPath string
	}{
		{"cgroupfs v1", cgroups.Layout{Driver: cgroups.Cgroupfs}, "/noderun/burstable/pod" + sandbox + "/ctr"},
		{"cgroupfs v2", cgroups.Layout{Driver: cgroups.Cgroupfs, Unified: true}, "/noderun/burstable/pod" + sandbox + "/ctr"},
		{"systemd v1", cgroups.Layout{Driver: cgroups.Systemd}, "noderun-burstable-pod" + sandbox + ".slice:noderun:ctr"},
		{"systemd v2", cgroups.Layout{Driver: cgroups.Systemd, Unified: true}, "noderun-burstable-pod" + sandbox + ".slice:noderun:ctr"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := &runner.ContainerConfig{
				ID: "ctr", Pod: &v1.Pod{}, Container: &v1.Container{Name: "ctr"}, Sandbox: &runner.Sandbox{ID: sandbox, Dir: "/run/noderun/pods/" + sandbox},
				CgroupParent: tc.layout.PodParent(cgroups.Burstable, sandbox),
				Resources:    runner.Resources{CPUShares: 512, CPUQuota: 50000, CPUPeriod: 100000, MemoryLimit: 64 << 20, NoSwap: true},
			}
			s := genSpec(t, specOpts(cfg, 0, tc.layout)...)
			if s.Linux.CgroupsPath != tc.cgroupsPath {
				t.Errorf("cgroupsPath %q, want %q", s.Linux.CgroupsPath, tc.cgroupsPath)
			}
			rt := &Runtime{runcRoot: "/run/noderun/runc", cgroups: tc.layout}
			if got := rt.runtimeOptions().SystemdCgroup; got != (tc.layout.Driver == cgroups.Systemd) {
				t.Errorf("runc option SystemdCgroup = %t", got)
			}
			res := s.Linux.Resources
			if !tc.layout.Unified {
				if *res.CPU.Shares != 512 || *res.CPU.Quota != 50000 || *res.CPU.Period != 100000 || *res.Memory.Limit != 64<<20 || *res.Memory.Swap != 64<<20 {
					t.Errorf("v1 resources: shares %d quota %d period %d memory %d memory+swap %d", *res.CPU.Shares, *res.CPU.Quota, *res.CPU.Period, *res.Memory.Limit, *res.Memory.Swap)
				}
				return
			}
			v2 := cgroup2.ToResources(res)
			// cpu.weight 1 + (512-2)*9999/262142 = 20, as runc and the kubelet compute it.
			if *v2.CPU.Weight != 20 || string(v2.CPU.Max) != "50000 100000" || *v2.Memory.Max != 64<<20 || res.Unified["memory.swap.max"] != "0" {
				t.Errorf("v2: cpu.weight %d, cpu.max %q, memory.max %d, unified %v; want 20, \"50000 100000\", %d, memory.swap.max 0",
					*v2.CPU.Weight, v2.CPU.Max, *v2.Memory.Max, res.Unified, 64<<20)
			}
		})
	}
}

// Containers get the CRI plugin's mounts, not containerd's defaults: no
// tmpfs on /run, their cgroups read-only at /sys/fs/cgroup (writable when
// privileged), and on cgroup v2 a cgroup namespace unless privileged.
func TestCRIDefaultMounts(t *testing.T) {
	yes := true
	for _, tc := range []struct {
		name       string
		unified    bool
		sc         *v1.SecurityContext
		wantOpt    string // ro or rw on the cgroup mount
		wantCgroup bool   // a cgroup namespace
	}{
		{"v1", false, nil, "ro", false},
		{"v2", true, nil, "ro", true},
		{"v2 privileged", true, &v1.SecurityContext{Privileged: &yes}, "rw", false},
		{"v1 privileged", false, &v1.SecurityContext{Privileged: &yes}, "rw", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := &runner.ContainerConfig{
				ID: "ctr", Pod: &v1.Pod{}, Container: &v1.Container{Name: "ctr", SecurityContext: tc.sc},
				Sandbox: &runner.Sandbox{ID: "abc", Dir: "/run/noderun/pods/abc"},
			}
			secOpts, err := hostSecurity{}.securityOpts(cfg)
			if err != nil {
				t.Fatal(err)
			}
			s := genSpec(t, append(specOpts(cfg, 0, cgroups.Layout{Unified: tc.unified}), secOpts...)...)
			var cg []specs.Mount
			for _, m := range s.Mounts {
				if m.Destination == "/run" {
					t.Errorf("a %s mount on /run", m.Type)
				}
				if m.Destination == "/sys/fs/cgroup" {
					cg = append(cg, m)
				}
			}
			if len(cg) != 1 || cg[0].Type != "cgroup" || !slices.Contains(cg[0].Options, tc.wantOpt) {
				t.Errorf("/sys/fs/cgroup mounts %+v, want one cgroup mount, %s", cg, tc.wantOpt)
			}
			if _, ok := nsPaths(s)[specs.CgroupNamespace]; ok != tc.wantCgroup {
				t.Errorf("cgroup namespace: %t, want %t", ok, tc.wantCgroup)
			}
		})
	}
	// A volume at /sys/fs/cgroup replaces the mount, as under CRI.
	cfg := &runner.ContainerConfig{ID: "ctr", Pod: &v1.Pod{}, Container: &v1.Container{Name: "ctr"},
		Sandbox: &runner.Sandbox{ID: "abc", Dir: "/run/noderun/pods/abc"},
		Mounts:  []runner.Mount{{Source: "/host/cg", Destination: "/sys/fs/cgroup"}}}
	s := genSpec(t, specOpts(cfg, 0, cgroups.Layout{})...)
	for _, m := range s.Mounts {
		if m.Destination == "/sys/fs/cgroup" && m.Source != "/host/cg" {
			t.Errorf("volume at /sys/fs/cgroup left %+v beside it", m)
		}
	}
}

// An ephemeral container with a target joins the target process's PID
// namespace; without one the spec is left as the sandbox made it.
func TestWithTargetPIDNamespace(t *testing.T) {
	sb := &runner.Sandbox{Dir: "/run/noderun/pods/abc"}
	got := nsPaths(genSpec(t, withSandboxNamespaces(sb), withTargetPIDNamespace(4242)))
	if got[specs.PIDNamespace] != "/proc/4242/ns/pid" {
		t.Errorf("PID namespace %q, want the target's /proc/4242/ns/pid", got[specs.PIDNamespace])
	}
	if got[specs.NetworkNamespace] != sb.NetNSPath() {
		t.Errorf("network namespace %q, want the pod's", got[specs.NetworkNamespace])
	}
	got = nsPaths(genSpec(t, withSandboxNamespaces(sb), withTargetPIDNamespace(0)))
	if p, ok := got[specs.PIDNamespace]; !ok || p != "" {
		t.Errorf("no target: PID namespace %q (present %v), want a new one", p, ok)
	}
}
