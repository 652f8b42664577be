package containerd

import (
	"context"
	"fmt"
	"os/exec"
	"strings"

	ctrd "github.com/containerd/containerd"
	tasksapi "github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/cio"
	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/mount"
	"github.com/containerd/containerd/oci"
	"github.com/containerd/containerd/protobuf"
	"github.com/containerd/containerd/snapshots"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// A container's root filesystem is mounted by runc inside the container's
// own mount namespace, as the spec's first mount (destination "/"), rather
// than by containerd's shim on the host at <bundle>/rootfs. Every mount on
// the host is a line that the kernel formats each time a process reads
// /proc/self/mountinfo, and runc reads it five times a container, the
// shim ten: an overlay line, with its three directories, is about 440
// bytes, two thirds of the host's table with 100 pods up. Kept off the
// host, a 100-pod start spends half as much CPU formatting mount tables
// (perf, 6.8 % of the machine's busy time before, 3.9 % after), and the
// shim no longer mounts and unmounts on the host, where each mount takes
// the namespace lock every table reader waits on. The container sees the
// same files; only the host no longer does (use /proc/<pid>/root).

// runc 1.2 and later refuse a mount whose destination is "/" ("mountpoint
// ... is on the top of rootfs", libcontainer's createMountpoint): every
// container would fail to start. So the rootfs goes inside only with a
// runc known to be older (Debian 12's 1.1.5); with a newer one, or one
// whose version cannot be read, the shim mounts it on the host, as
// containerd does for everyone else. The runc is the one on noderun's
// PATH, which a managed containerd's shims share, as do a service
// manager's on the hosts noderun packages for (/usr/sbin/runc).

// runcMountsRootInside runs runc --version and tells whether that runc
// accepts the rootfs as the spec's first mount, and the version it read.
func runcMountsRootInside(ctx context.Context) (bool, string) {
	out, err := exec.CommandContext(ctx, "runc", "--version").Output()
	if err != nil {
		return false, err.Error()
	}
	line, _, _ := strings.Cut(string(out), "\n")
	return runcBefore12(line), line
}

// runcBefore12 reads runc --version's first line, "runc version 1.1.5+ds1".
func runcBefore12(line string) bool {
	v, ok := strings.CutPrefix(strings.TrimSpace(line), "runc version ")
	if !ok {
		return false
	}
	var major, minor int
	if _, err := fmt.Sscanf(v, "%d.%d", &major, &minor); err != nil {
		return false
	}
	return major < 1 || major == 1 && minor < 2
}

// maxInsideMountData bounds the overlay options runc is handed: the kernel
// takes a mount's data in one page, and containerd's shim shortens a long
// lowerdir (many layers) by mounting from their common directory, which
// runc does not. Longer ones are mounted on the host as before. A variable
// for the tests to take that path.
var maxInsideMountData = 4000

// rootfs carries a container's snapshot mounts from its preparation to its
// spec and its task.
type rootfs struct {
	mounts   []mount.Mount
	insideOK bool // runc can mount them (Runtime.rootfsInside)
	inside   bool // the spec mounts them; the task is created without
}

// prepare prepares the container's writable snapshot on the image's
// unpacked rootfs (what containerd's WithNewSnapshot does, without reading
// the image's manifest and config again) and keeps its mounts; opts label
// it (remapLabels).
func (fs *rootfs) prepare(snapshotter, id, parent string, opts ...snapshots.Opt) ctrd.NewContainerOpts {
	return func(ctx context.Context, client *ctrd.Client, c *containers.Container) error {
		ms, err := client.SnapshotService(snapshotter).Prepare(ctx, id, parent, opts...)
		if err != nil {
			return fmt.Errorf("prepare snapshot %s: %w", id, err)
		}
		c.Snapshotter, c.SnapshotKey = snapshotter, id
		fs.mounts = ms
		return nil
	}
}

// specOpt, the last of the spec's options, puts the rootfs first in the
// spec's mounts when runc can mount it there.
func (fs *rootfs) specOpt() oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		m, ok := insideMount(fs.mounts, s)
		ok = ok && fs.insideOK
		fs.inside = ok
		if ok {
			s.Mounts = append([]specs.Mount{m}, s.Mounts...)
		}
		return nil
	}
}

// insideMount is the spec mount of a snapshot's mounts, if runc can make
// it: a single overlay (the overlayfs snapshotter's active snapshot) whose
// options fit a page, and no SELinux label to add.
func insideMount(ms []mount.Mount, s *oci.Spec) (specs.Mount, bool) {
	if len(ms) != 1 || ms[0].Type != "overlay" || (s.Linux != nil && s.Linux.MountLabel != "") {
		return specs.Mount{}, false
	}
	if len(strings.Join(ms[0].Options, ",")) > maxInsideMountData {
		return specs.Mount{}, false
	}
	return specs.Mount{Destination: "/", Type: ms[0].Type, Source: ms[0].Source, Options: ms[0].Options}, true
}

// newTask creates c's task. Its rootfs goes to the shim to mount on the
// host unless the spec mounts it: containerd's client always hands the
// shim the container's snapshot, so that task is created through the task
// service itself.
func (fs *rootfs) newTask(ctx context.Context, client *ctrd.Client, c ctrd.Container, stdio cio.Config, o *options.Options) error {
	if !fs.inside {
		_, err := c.NewTask(ctx, func(string) (cio.IO, error) { return configIO(stdio), nil }, withTaskOptions(o))
		return err
	}
	opts, err := typeurl.MarshalAny(o)
	if err != nil {
		return err
	}
	_, err = client.TaskService().Create(ctx, &tasksapi.CreateTaskRequest{
		ContainerID: c.ID(),
		Stdin:       stdio.Stdin,
		Stdout:      stdio.Stdout,
		Stderr:      stdio.Stderr,
		Terminal:    stdio.Terminal,
		Options:     protobuf.FromAny(opts),
	})
	return errdefs.FromGRPC(err)
}

// configIO is a task's stdio as the shim is to open it: paths and URIs
// only, nothing copied on this side (cio.LogURI's IO, with any Config).
type configIO cio.Config

func (c configIO) Config() cio.Config { return cio.Config(c) }
func (configIO) Cancel()              {}
func (configIO) Wait()                {}
func (configIO) Close() error         { return nil }
