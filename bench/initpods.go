package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/namespaces"
	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/cni"
)

// The init-container scenario: a pod with initCount init containers, each
// exiting at once, then appCount app containers running podCommand.
const (
	initCount = 3
	appCount  = 2
)

var initCommand = []string{"sh", "-c", "exit 0"}

// initPodSpec is the scenario's pod for noderun.
func initPodSpec(s *v1.PodSpec) {
	app := s.Containers[0]
	s.Containers = nil
	for i := range appCount {
		c := app
		c.Name = fmt.Sprintf("app%d", i)
		s.Containers = append(s.Containers, c)
	}
	for i := range initCount {
		s.InitContainers = append(s.InitContainers, v1.Container{Name: fmt.Sprintf("init%d", i), Image: imageRef, Command: initCommand})
	}
}

// floorRun is one container of a floor pod with several.
type floorRun struct {
	c    containerd.Container
	task containerd.Task
	app  bool // running podCommand until stopped
}

// floorMulti is a floor pod with init and app containers.
type floorMulti struct {
	pod  floorPod // its sandbox: id and dir
	runs []*floorRun
}

// startInitPod does, in sequence, what the kubelet's order asks of such a
// pod: namespaces, CNI ADD, each init container created, started and waited
// for, then each app container created and started. On error the pod holds
// what was made, for stopInitPod.
func (f *floor) startInitPod(ctx context.Context, id string) (*floorMulti, error) {
	ctx = namespaces.WithNamespace(ctx, floorNS)
	p := &floorMulti{pod: floorPod{id: id, dir: filepath.Join(f.podsDir, id)}}
	if _, err := cni.CreateNamespaces(p.pod.dir, id, false, nil); err != nil {
		return p, err
	}
	if _, err := f.plugins.AddNetworkList(ctx, f.network, f.rtConf(&p.pod)); err != nil {
		return p, fmt.Errorf("CNI ADD %s: %w", id, err)
	}
	for i := range initCount {
		r, err := f.newRun(ctx, p, fmt.Sprintf("%s-init%d", id, i), initCommand)
		if err != nil {
			return p, err
		}
		exited, err := r.task.Wait(ctx)
		if err != nil {
			return p, err
		}
		if err := r.task.Start(ctx); err != nil {
			return p, fmt.Errorf("start task %s: %w", r.c.ID(), err)
		}
		select {
		case st := <-exited:
			if st.ExitCode() != 0 {
				return p, fmt.Errorf("init container %s exited %d", r.c.ID(), st.ExitCode())
			}
		case <-ctx.Done():
			return p, ctx.Err()
		}
	}
	for i := range appCount {
		r, err := f.newRun(ctx, p, fmt.Sprintf("%s-app%d", id, i), podCommand)
		if err != nil {
			return p, err
		}
		if err := r.task.Start(ctx); err != nil {
			return p, fmt.Errorf("start task %s: %w", r.c.ID(), err)
		}
		r.app = true
	}
	return p, nil
}

// newRun creates one container of p and its task, as floor.start does.
func (f *floor) newRun(ctx context.Context, p *floorMulti, cid string, args []string) (*floorRun, error) {
	c, task, err := f.create(ctx, p.pod.dir, cid, p.pod.id, cid, args)
	if c != nil {
		p.runs = append(p.runs, &floorRun{c: c, task: task})
	}
	if err != nil {
		return nil, err
	}
	return p.runs[len(p.runs)-1], nil
}

// stopInitPod is the reverse: SIGTERM to the app containers, then every
// task and container deleted, CNI DEL, namespaces unpinned.
func (f *floor) stopInitPod(ctx context.Context, p *floorMulti) error {
	ctx = namespaces.WithNamespace(ctx, floorNS)
	var errs []error
	for _, r := range p.runs {
		if r.app {
			errs = append(errs, terminate(ctx, r.task))
		}
	}
	for _, r := range p.runs {
		if r.task != nil {
			if _, err := r.task.Delete(ctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("delete task %s: %w", r.c.ID(), err))
			}
		}
		if err := r.c.Delete(ctx, containerd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete container %s: %w", r.c.ID(), err))
		}
	}
	if err := f.plugins.DelNetworkList(ctx, f.network, f.rtConf(&p.pod)); err != nil {
		errs = append(errs, fmt.Errorf("CNI DEL %s: %w", p.pod.id, err))
	}
	errs = append(errs, cni.RemoveNamespaces(p.pod.dir, nil))
	removeCgroup(f.cgroup + "/" + p.pod.id)
	errs = append(errs, os.RemoveAll(filepath.Join(f.logDir, p.pod.id)))
	return errors.Join(errs...)
}

// initPod measures the scenario once on each side: start until every
// container has started (the init containers' starts included), teardown
// until no container or pinned namespace is left.
func (b *bench) initPod(ctx context.Context, rep int) error {
	runs := initCount + appCount
	return alternate(rep, func() error {
		start, down, err := b.floorInitPod(ctx, fmt.Sprintf("fi%d", rep), runs)
		b.m.initPod.floor = append(b.m.initPod.floor, start.Seconds())
		b.m.initPodTeardown.floor = append(b.m.initPodTeardown.floor, down.Seconds())
		return err
	}, func() error {
		start, down, err := b.nodePodsWith(ctx, []string{fmt.Sprintf("ni%d", rep)}, runs, initPodSpec)
		b.m.initPod.noderun = append(b.m.initPod.noderun, start.Seconds())
		b.m.initPodTeardown.noderun = append(b.m.initPodTeardown.noderun, down.Seconds())
		return err
	})
}

func (b *bench) floorInitPod(ctx context.Context, id string, runs int) (start, down time.Duration, err error) {
	return b.timeFloor(ctx, runs, nil, nil, func(ctx context.Context) (func(context.Context) error, error) {
		p, err := b.floor.startInitPod(ctx, id)
		if p == nil {
			return nil, err
		}
		return func(ctx context.Context) error { return b.floor.stopInitPod(ctx, p) }, err
	})
}

// nodePodsWith writes the pods, shaped by spec, and removes them again;
// start runs until runs containers have started, down until runs were
// deleted and no namespace is pinned.
func (b *bench) nodePodsWith(ctx context.Context, names []string, runs int, spec func(*v1.PodSpec)) (start, down time.Duration, err error) {
	if err := sleep(ctx, settle); err != nil {
		return 0, 0, err
	}
	b.nw.drain()
	t0, err := b.node.writePods(names, spec)
	if err != nil {
		return 0, 0, err
	}
	at, err := b.nw.waitN(ctx, topicStart, runs, waitTimeout)
	if err != nil {
		return 0, 0, err
	}
	start = at.Sub(t0)
	if _, err := b.node.waitRunning(ctx, names, 100*time.Millisecond, waitTimeout); err != nil {
		return start, 0, err
	}
	if err := sleep(ctx, settle); err != nil {
		return start, 0, err
	}
	down, err = b.removeNodePods(ctx, names, runs)
	return start, down, err
}
