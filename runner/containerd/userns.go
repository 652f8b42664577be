package containerd

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/mount"
	"github.com/containerd/containerd/oci"
	"github.com/containerd/containerd/snapshots"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/noderun/noderun/runner"
)

// Pod user namespaces (hostUsers: false). The pod's user namespace is
// made and pinned with its sandbox (cni.CreateNamespacesInUserNS); each
// container joins it and gets the parts containerd 2's CRI gives a
// user-namespaced container:
//   - its rootfs idmapped: the overlay snapshotter's uidmapping and
//     gidmapping labels, which make it chown the new upper dir to the
//     pod's root and return mounts with uidmap/gidmap options, which the
//     containerd 2 shim mounts over idmapped lower layers;
//   - its volume and pod file bind mounts idmapped with the pod's mapping
//     (the kubelet passes it on every mount; runc 1.2's idmapped mounts),
//     so a file root owns on the host is root's in the pod and back.

// probeUserNamespaces tells whether pods can have user namespaces, as
// containerd's CRI tells the kubelet through its runtime handler's
// user_namespaces feature: only containerd 2 reports it (1.7's CRI has no
// runtime handler features, so the kubelet counts it as without), and
// containerd 2 sets it when the runc's `runc features` lists idmapped
// mounts (runc 1.2 and later). The second result says what was found.
func (r *Runtime) probeUserNamespaces(f runcFeatures) (bool, string) {
	if !f.Linux.MountExtensions.IDMap.Enabled {
		return false, "runc lists no idmapped mounts in `runc features` (runc 1.2 or later has them)"
	}
	ctx, cancel := context.WithTimeout(r.ctx(context.Background()), 10*time.Second)
	defer cancel()
	v, err := r.client.Version(ctx)
	if err != nil {
		return false, "containerd's version could not be read: " + err.Error()
	}
	var major int
	if _, err := fmt.Sscanf(strings.TrimPrefix(v.Version, "v"), "%d", &major); err != nil || major < 2 {
		return false, fmt.Sprintf("containerd %s reports no user namespace support (containerd 2.0 or later does)", v.Version)
	}
	why := fmt.Sprintf("containerd %s and a runc with idmapped mounts", v.Version)
	var u unix.Utsname
	if unix.Uname(&u) == nil && kernelBefore63(unix.ByteSliceToString(u.Release[:])) {
		// The kubelet warns likewise: tmpfs (the pod's files, secrets)
		// cannot be idmapped before Linux 6.3.
		why += "; WARNING: the kernel is older than 6.3, the minimum user namespaces need"
	}
	return true, why
}

func kernelBefore63(release string) bool {
	var major, minor int
	if _, err := fmt.Sscanf(release, "%d.%d", &major, &minor); err != nil {
		return false
	}
	return major < 6 || major == 6 && minor < 3
}

// UserNamespaces says whether pods can have user namespaces of their own
// (hostUsers: false), and what the probe found.
func (r *Runtime) UserNamespaces() (bool, string) { return r.userns, r.usernsWhy }

// podIDMap is the pod's mapping as the OCI spec has it, nil for the host's.
func podIDMap(sb *runner.Sandbox) []specs.LinuxIDMapping {
	if sb == nil || sb.UserNS == nil {
		return nil
	}
	return []specs.LinuxIDMapping{{ContainerID: 0, HostID: sb.UserNS.HostID, Size: sb.UserNS.Length}}
}

// withUserNamespace joins the pod's pinned user namespace, with its
// mapping in the spec (runc checks that they agree, and uses it for the
// container's view of its IDs), and idmaps the bind mounts of the
// container's mounts with it. It must follow withMounts.
func withUserNamespace(sb *runner.Sandbox, mounts []runner.Mount) oci.SpecOpts {
	return func(ctx context.Context, cl oci.Client, c *containers.Container, s *oci.Spec) error {
		ids := podIDMap(sb)
		if ids == nil {
			return nil
		}
		s.Linux.UIDMappings, s.Linux.GIDMappings = ids, ids
		dests := map[string]bool{}
		for _, m := range mounts {
			dests[m.Destination] = true
		}
		for i := range s.Mounts {
			if m := &s.Mounts[i]; m.Type == "bind" && dests[m.Destination] {
				m.UIDMappings, m.GIDMappings = ids, ids
			}
		}
		return oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.UserNamespace, Path: sb.UserNSPath()})(ctx, cl, c, s)
	}
}

// remapLabels are the snapshot labels that have the overlay snapshotter
// idmap a container's rootfs (containerd's WithUserNSRemapperLabels:
// "containerID:hostID:size"); none without a user namespace.
func remapLabels(sb *runner.Sandbox) []snapshots.Opt {
	ids := podIDMap(sb)
	if ids == nil {
		return nil
	}
	v := fmt.Sprintf("%d:%d:%d", ids[0].ContainerID, ids[0].HostID, ids[0].Size)
	return []snapshots.Opt{snapshots.WithLabels(map[string]string{
		"containerd.io/snapshot/uidmapping": v,
		"containerd.io/snapshot/gidmapping": v,
	})}
}

// unmappedClient is an oci.Client whose snapshots' mounts lose their
// uidmap and gidmap options: containerd's client library (1.7) mounts a
// container's rootfs to read its passwd and group files and knows no such
// options, and reading them needs no idmapping.
type unmappedClient struct{ oci.Client }

func (c unmappedClient) SnapshotService(name string) snapshots.Snapshotter {
	return unmappedSnapshotter{c.Client.SnapshotService(name)}
}

type unmappedSnapshotter struct{ snapshots.Snapshotter }

func (s unmappedSnapshotter) Mounts(ctx context.Context, key string) ([]mount.Mount, error) {
	ms, err := s.Snapshotter.Mounts(ctx, key)
	for i := range ms {
		var keep []string
		for _, o := range ms[i].Options {
			if !strings.HasPrefix(o, "uidmap=") && !strings.HasPrefix(o, "gidmap=") {
				keep = append(keep, o)
			}
		}
		ms[i].Options = keep
	}
	return ms, err
}
