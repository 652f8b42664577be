package containerd

import (
	"context"
	"slices"
	"testing"

	"github.com/containerd/containerd/mount"
	"github.com/containerd/containerd/snapshots"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/runner"
)

// A container of a user-namespaced pod joins the pod's user namespace,
// with its mapping, and its volume mounts are idmapped with it; other
// mounts (containerd's defaults) are not.
func TestWithUserNamespace(t *testing.T) {
	sb := &runner.Sandbox{Dir: "/run/noderun/pods/abc", UserNS: &runner.IDMapping{HostID: 3 * 65536, Length: 65536}}
	mounts := []runner.Mount{{Source: "/data", Destination: "/data"}}
	s := genSpec(t, withMounts(mounts, readMountinfo), withUserNamespace(sb, mounts))
	want := []specs.LinuxIDMapping{{ContainerID: 0, HostID: 196608, Size: 65536}}
	if !slices.Equal(s.Linux.UIDMappings, want) || !slices.Equal(s.Linux.GIDMappings, want) {
		t.Errorf("mappings %+v %+v, want %+v", s.Linux.UIDMappings, s.Linux.GIDMappings, want)
	}
	if p := nsPaths(s)[specs.UserNamespace]; p != "/run/noderun/pods/abc/user" {
		t.Errorf("user namespace path %q", p)
	}
	for _, m := range s.Mounts {
		if idmapped := m.UIDMappings != nil && m.GIDMappings != nil; idmapped != (m.Destination == "/data") {
			t.Errorf("%s (%s): idmapped %v", m.Destination, m.Type, idmapped)
		}
	}
	if got := remapLabels(sb); len(got) != 1 {
		t.Fatalf("remap labels: %d options", len(got))
	}
	var info snapshots.Info
	remapLabels(sb)[0](&info)
	if info.Labels["containerd.io/snapshot/uidmapping"] != "0:196608:65536" || info.Labels["containerd.io/snapshot/gidmapping"] != "0:196608:65536" {
		t.Errorf("snapshot labels %v", info.Labels)
	}

	plain := genSpec(t, withUserNamespace(&runner.Sandbox{Dir: "/x"}, mounts))
	if _, ok := nsPaths(plain)[specs.UserNamespace]; ok || plain.Linux.UIDMappings != nil || remapLabels(&runner.Sandbox{}) != nil {
		t.Error("a pod in the host's user namespace got one of its own")
	}
}

// procMount Unmasked leaves nothing of /proc masked or read-only.
func TestProcMountUnmasked(t *testing.T) {
	unmasked := v1.UnmaskedProcMount
	s := secSpec(t, hostSecurity{}, podWith(&v1.SecurityContext{ProcMount: &unmasked}))
	if len(s.Linux.MaskedPaths) != 0 || len(s.Linux.ReadonlyPaths) != 0 {
		t.Errorf("masked %v, read-only %v; want none", s.Linux.MaskedPaths, s.Linux.ReadonlyPaths)
	}
	def := secSpec(t, hostSecurity{}, podWith(nil))
	if !slices.Equal(def.Linux.MaskedPaths, defaultMaskedPaths) || !slices.Equal(def.Linux.ReadonlyPaths, defaultReadonlyPaths) {
		t.Errorf("default: masked %v, read-only %v", def.Linux.MaskedPaths, def.Linux.ReadonlyPaths)
	}
}

type mountsSnapshotter struct {
	snapshots.Snapshotter
	ms []mount.Mount
}

func (s mountsSnapshotter) Mounts(context.Context, string) ([]mount.Mount, error) { return s.ms, nil }

func TestUnmappedSnapshotterDropsIDMapOptions(t *testing.T) {
	s := unmappedSnapshotter{mountsSnapshotter{ms: []mount.Mount{{Type: "overlay", Options: []string{"index=off", "uidmap=0:65536:65536", "gidmap=0:65536:65536", "lowerdir=/l"}}}}}
	ms, err := s.Mounts(context.Background(), "k")
	if err != nil || !slices.Equal(ms[0].Options, []string{"index=off", "lowerdir=/l"}) {
		t.Errorf("options %v, %v", ms[0].Options, err)
	}
}

func TestKernelBefore63(t *testing.T) {
	for rel, want := range map[string]bool{"6.1.0-28-amd64": true, "5.15.0": true, "6.3.0": false, "6.18.44-fc": false, "7.0": false} {
		if got := kernelBefore63(rel); got != want {
			t.Errorf("%s: %v", rel, got)
		}
	}
}
