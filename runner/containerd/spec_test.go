package containerd

import (
	"context"
	"slices"
	"testing"

	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

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
	}))
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

func TestWithOOMScoreAdjClampsToOwn(t *testing.T) {
	for _, tc := range []struct{ want, own, got int }{{-997, 0, 0}, {1000, 0, 1000}, {500, 600, 600}} {
		s := genSpec(t, withOOMScoreAdj(tc.want, tc.own))
		if *s.Process.OOMScoreAdj != tc.got {
			t.Errorf("want %d own %d: got %d, expected %d", tc.want, tc.own, *s.Process.OOMScoreAdj, tc.got)
		}
	}
}

func TestWithResources(t *testing.T) {
	r := v1.ResourceRequirements{
		Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("250m")},
		Limits:   v1.ResourceList{v1.ResourceCPU: resource.MustParse("500m"), v1.ResourceMemory: resource.MustParse("64Mi")},
	}
	res := genSpec(t, withResources(r)).Linux.Resources
	if *res.CPU.Shares != 256 || *res.CPU.Quota != 50000 || *res.CPU.Period != 100000 {
		t.Errorf("cpu shares/quota/period = %d/%d/%d, want 256/50000/100000", *res.CPU.Shares, *res.CPU.Quota, *res.CPU.Period)
	}
	if *res.Memory.Limit != 64<<20 {
		t.Errorf("memory limit %d, want %d", *res.Memory.Limit, 64<<20)
	}
	best := genSpec(t, withResources(v1.ResourceRequirements{})).Linux.Resources
	if *best.CPU.Shares != 2 || best.CPU.Quota != nil || best.Memory != nil {
		t.Errorf("BestEffort: shares %d quota %v memory %v; want 2, none, none", *best.CPU.Shares, best.CPU.Quota, best.Memory)
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
