package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/cio"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/oci"
	"github.com/containerd/containerd/plugin"
	"github.com/containernetworking/cni/libcni"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/noderun/noderun/cni"
	"github.com/noderun/noderun/crilog"
	"github.com/noderun/noderun/internal/testnode"
	ctrdrt "github.com/noderun/noderun/runner/containerd"
)

// floor does a pod's work straight on the containerd client and libcni,
// with no noderun in between: pinned net/ipc/uts namespaces, CNI ADD, a
// container from the same image and snapshotter with the OCI spec basics
// noderun uses (joined namespaces, a cgroup per pod, runc v2 with a private
// root, noderun's binary log driver), task start; and the reverse. What it
// leaves out (image config lookup per start, pod files, labels, state on
// disk, supplementary groups read from the image) is noderun's own cost.
type floor struct {
	client    *containerd.Client
	image     containerd.Image
	env       []string // the image's environment, read once
	plugins   *libcni.CNIConfig
	network   *libcni.NetworkConfigList
	podsDir   string
	logDir    string
	runcRoot  string
	logDriver string
	cgroup    string
}

// floorPod is what a floor start made, for the teardown to undo.
type floorPod struct {
	id, dir string
	c       containerd.Container
	task    containerd.Task
	started bool
}

func floorCgroup(envDir string) string { return "/nrbench-" + filepath.Base(envDir) }

func newFloor(ctx context.Context, e *env) (*floor, error) {
	dir := filepath.Join(e.dir, "floor")
	f := &floor{
		client:    e.client,
		podsDir:   filepath.Join(dir, "pods"),
		logDir:    filepath.Join(dir, "logs"),
		runcRoot:  filepath.Join(dir, "runc"),
		logDriver: e.driver,
		cgroup:    floorCgroup(e.dir),
		plugins:   libcni.NewCNIConfigWithCacheDir([]string{testnode.CNIBinDir}, filepath.Join(dir, "cni"), nil),
	}
	for _, d := range []string{f.podsDir, f.runcRoot} {
		if err := e.runState(d); err != nil {
			return nil, err
		}
	}
	var err error
	if f.network, err = libcni.ConfListFromFile(e.cniConf); err != nil {
		return nil, err
	}
	ctx = namespaces.WithNamespace(ctx, floorNS)
	if _, err := ctrdrt.ImportArchive(ctx, e.client, e.imageTar, snapshotter); err != nil {
		return nil, err
	}
	if f.image, err = e.client.GetImage(ctx, imageRef); err != nil {
		return nil, err
	}
	spec, err := f.image.Spec(ctx)
	if err != nil {
		return nil, err
	}
	f.env = spec.Config.Env
	return f, nil
}

func (f *floor) rtConf(p *floorPod) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{
		ContainerID: p.id, NetNS: filepath.Join(p.dir, "net"), IfName: "eth0",
		Args: [][2]string{
			{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "default"}, {"K8S_POD_NAME", p.id},
			{"K8S_POD_INFRA_CONTAINER_ID", p.id},
		},
	}
}

// start runs one pod. On error the returned pod holds what was made, for
// stop to remove.
func (f *floor) start(ctx context.Context, id string) (*floorPod, error) {
	ctx = namespaces.WithNamespace(ctx, floorNS)
	p := &floorPod{id: id, dir: filepath.Join(f.podsDir, id)}
	if _, err := cni.CreateNamespaces(p.dir, id, false, nil); err != nil {
		return p, err
	}
	if _, err := f.plugins.AddNetworkList(ctx, f.network, f.rtConf(p)); err != nil {
		return p, fmt.Errorf("CNI ADD %s: %w", id, err)
	}
	c, task, err := f.create(ctx, p.dir, id, id, "main", podCommand)
	p.c, p.task = c, task
	if err != nil {
		return p, err
	}
	if err := task.Start(ctx); err != nil {
		return p, fmt.Errorf("start task %s: %w", id, err)
	}
	p.started = true
	return p, nil
}

// create makes container cid of the pod pinned in dir and its task, with
// the OCI basics noderun uses: the pod's namespaces joined, the cgroup
// <pod>/<name>, runc's private root and the binary log driver writing
// <pod>/<name>.log. The container is returned even when its task fails.
func (f *floor) create(ctx context.Context, dir, cid, pod, name string, args []string) (containerd.Container, containerd.Task, error) {
	runtimeOpts := &options.Options{Root: f.runcRoot}
	join := func(t specs.LinuxNamespaceType, ns string) oci.SpecOpts {
		return oci.WithLinuxNamespace(specs.LinuxNamespace{Type: t, Path: filepath.Join(dir, ns)})
	}
	c, err := f.client.NewContainer(ctx, cid,
		containerd.WithImageName(f.image.Name()),
		containerd.WithSnapshotter(snapshotter),
		containerd.WithNewSnapshot(cid, f.image),
		containerd.WithRuntime(plugin.RuntimeRuncV2, runtimeOpts),
		containerd.WithNewSpec(
			oci.WithProcessArgs(args...),
			oci.WithEnv(f.env),
			oci.WithProcessCwd("/"),
			join(specs.IPCNamespace, "ipc"), join(specs.NetworkNamespace, "net"), join(specs.UTSNamespace, "uts"),
			oci.WithCgroup(f.cgroup+"/"+pod+"/"+name),
		))
	if err != nil {
		return nil, nil, fmt.Errorf("create container %s: %w", cid, err)
	}
	task, err := f.newTask(ctx, c, pod, name)
	return c, task, err
}

// newTask creates container c's task (a new process), logging to
// <pod>/<name>.log.
func (f *floor) newTask(ctx context.Context, c containerd.Container, pod, name string) (containerd.Task, error) {
	logURI, err := url.Parse(crilog.URI(f.logDriver, crilog.Target{Path: filepath.Join(f.logDir, pod, name+".log")}))
	if err != nil {
		return nil, err
	}
	task, err := c.NewTask(ctx, cio.LogURI(logURI), func(_ context.Context, _ *containerd.Client, ti *containerd.TaskInfo) error {
		ti.Options = &options.Options{Root: f.runcRoot} // as noderun does, so the shim gets the runc root on every daemon version
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("create task %s: %w", c.ID(), err)
	}
	return task, nil
}

// stop is the reverse: SIGTERM and wait for the exit, delete the task, the
// container with its snapshot, CNI DEL, unpin the namespaces, remove the pod
// cgroup and log dir. It also cleans up after a partial start.
func (f *floor) stop(ctx context.Context, p *floorPod) error {
	ctx = namespaces.WithNamespace(ctx, floorNS)
	var errs []error
	if p.started {
		errs = append(errs, terminate(ctx, p.task))
	}
	if p.task != nil {
		if _, err := p.task.Delete(ctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete task %s: %w", p.id, err))
		}
	}
	if p.c != nil {
		if err := p.c.Delete(ctx, containerd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete container %s: %w", p.id, err))
		}
	}
	if err := f.plugins.DelNetworkList(ctx, f.network, f.rtConf(p)); err != nil {
		errs = append(errs, fmt.Errorf("CNI DEL %s: %w", p.id, err))
	}
	errs = append(errs, cni.RemoveNamespaces(p.dir, nil))
	removeCgroup(f.cgroup + "/" + p.id)
	errs = append(errs, os.RemoveAll(filepath.Join(f.logDir, p.id)))
	return errors.Join(errs...)
}

// terminate sends SIGTERM and waits for the exit.
func terminate(ctx context.Context, task containerd.Task) error {
	exited, err := task.Wait(ctx)
	if err != nil {
		return err
	}
	if err := task.Kill(ctx, syscall.SIGTERM); err != nil && !errdefs.IsNotFound(err) {
		return err
	}
	select {
	case <-exited:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// startAll starts the pods in parallel, one goroutine each, as noderun runs
// one worker per pod. It returns every pod made, also on error.
func (f *floor) startAll(ctx context.Context, ids []string) ([]*floorPod, error) {
	pods := make([]*floorPod, len(ids))
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pods[i], errs[i] = f.start(ctx, id)
		}()
	}
	wg.Wait()
	return pods, errors.Join(errs...)
}

// stopAll stops the pods in parallel.
func (f *floor) stopAll(ctx context.Context, pods []*floorPod) error {
	errs := make([]error, len(pods))
	var wg sync.WaitGroup
	for i, p := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f.stop(ctx, p)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
