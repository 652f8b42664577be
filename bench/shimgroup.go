package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/cio"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/oci"
	"github.com/containerd/containerd/plugin"
	"github.com/noderun/noderun/internal/testnode"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// What one runc v2 shim per pod saves over one per container, for pods of
// several containers (issue 12). The runc v2 shim serves every task whose
// spec carries the same group annotation (containerd's CRI sets the
// sandbox's ID under its own key); the floor starts the same pods without
// and with it, noderun starts them from manifests, and each time the shims
// are counted and their PSS summed.

// groupAnnotation is the runc v2 shim's own grouping key.
const groupAnnotation = "io.containerd.runc.v2.group"

// shimUse is the shims of one namespace on the bench's containerd.
type shimUse struct {
	count int
	pss   float64 // MiB
}

// shimMeasures are the samples of the multi-container pods.
type shimMeasures struct {
	pods, containers               int
	perContainer, grouped, noderun []shimUse
}

// measureShims counts the shims of namespace ns on the bench's containerd
// and sums their PSS.
func (b *bench) measureShims(ns string) (shimUse, error) {
	var out shimUse
	procs, err := testnode.Processes()
	if err != nil {
		return out, err
	}
	for _, pr := range procs {
		pid, args := pr.PID, pr.Args
		if len(args) == 0 || filepath.Base(args[0]) != "containerd-shim-runc-v2" || !slices.Contains(args, b.env.daemon.Address()) {
			continue
		}
		if i := slices.Index(args, "-namespace"); i < 0 || i+1 >= len(args) || args[i+1] != ns {
			continue
		}
		kib, err := pssKiB(pid)
		if err != nil {
			continue // ended meanwhile
		}
		out.count++
		out.pss += float64(kib) / 1024
	}
	return out, nil
}

// shimGroups takes the samples: the floor without and with grouping, then
// noderun, once per burst repetition.
func (b *bench) shimGroups(ctx context.Context) error {
	m := &b.m.shims
	m.pods, m.containers = b.cfg.ShimPods, b.cfg.ShimContainers
	for r := range b.cfg.BurstRuns {
		b.logf("%d pods × %d containers, run %d/%d", m.pods, m.containers, r+1, b.cfg.BurstRuns)
		for _, grouped := range []bool{false, true} {
			use, err := b.floorMultiPods(ctx, fmt.Sprintf("g%vr%d", grouped, r), grouped)
			if err != nil {
				return err
			}
			if grouped {
				m.grouped = append(m.grouped, use)
			} else {
				m.perContainer = append(m.perContainer, use)
			}
		}
		use, err := b.nodeMultiPods(ctx, fmt.Sprintf("nmr%d", r))
		if err != nil {
			return err
		}
		m.noderun = append(m.noderun, use)
	}
	return nil
}

// floorMultiPods starts the pods' containers straight on containerd (host
// namespaces and no IO: only the shims differ), measures the shims once
// settled, and removes the containers.
func (b *bench) floorMultiPods(ctx context.Context, prefix string, grouped bool) (use shimUse, retErr error) {
	ctx = namespaces.WithNamespace(ctx, floorNS)
	f := b.floor
	runtimeOpts := &options.Options{Root: f.runcRoot}
	var made []containerd.Container
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTime)
		defer cancel()
		for _, c := range made {
			if task, err := c.Task(cctx, nil); err == nil {
				if _, err := task.Delete(cctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
					retErr = errors.Join(retErr, err)
				}
			}
			retErr = errors.Join(retErr, c.Delete(cctx, containerd.WithSnapshotCleanup))
		}
		removeCgroup(f.cgroup + "/" + prefix)
	}()
	for _, pod := range podNames(prefix, b.cfg.ShimPods) {
		for i := range b.cfg.ShimContainers {
			id := fmt.Sprintf("%s-c%d", pod, i)
			specOpts := []oci.SpecOpts{oci.WithProcessArgs(podCommand...), oci.WithEnv(f.env), oci.WithProcessCwd("/"),
				oci.WithCgroup(f.cgroup + "/" + prefix + "/" + id)}
			if grouped {
				specOpts = append(specOpts, oci.WithAnnotations(map[string]string{groupAnnotation: pod}))
			}
			c, err := f.client.NewContainer(ctx, id, containerd.WithImageName(f.image.Name()),
				containerd.WithSnapshotter(snapshotter), containerd.WithNewSnapshot(id, f.image),
				containerd.WithRuntime(plugin.RuntimeRuncV2, runtimeOpts), containerd.WithNewSpec(specOpts...))
			if err != nil {
				return use, fmt.Errorf("create container %s: %w", id, err)
			}
			made = append(made, c)
			task, err := c.NewTask(ctx, cio.NullIO, func(_ context.Context, _ *containerd.Client, ti *containerd.TaskInfo) error {
				ti.Options = runtimeOpts
				return nil
			})
			if err != nil {
				return use, fmt.Errorf("create task %s: %w", id, err)
			}
			if err := task.Start(ctx); err != nil {
				return use, fmt.Errorf("start task %s: %w", id, err)
			}
		}
	}
	if err := sleep(ctx, settle); err != nil {
		return use, err
	}
	return b.measureShims(floorNS)
}

// nodeMultiPods has noderun run the pods from manifests, measures its
// shims once all are Running and settled, and removes the pods.
func (b *bench) nodeMultiPods(ctx context.Context, prefix string) (shimUse, error) {
	names := podNames(prefix, b.cfg.ShimPods)
	if err := b.node.writeMultiManifests(names, b.cfg.ShimContainers); err != nil {
		return shimUse{}, err
	}
	_, runErr := b.node.waitRunning(ctx, names, 100*time.Millisecond, waitTimeout)
	use, err := shimUse{}, runErr
	if runErr == nil {
		if err = sleep(ctx, settle); err == nil {
			use, err = b.measureShims(noderunNS)
		}
	}
	if _, rmErr := b.node.removeManifests(names); rmErr != nil {
		return use, errors.Join(err, rmErr)
	}
	return use, errors.Join(err, b.node.waitNoPods(ctx, waitTimeout))
}

// writeMultiManifests writes pods of `containers` containers each.
func (n *node) writeMultiManifests(names []string, containers int) error {
	grace := int64(10)
	for _, name := range names {
		pod := v1.Pod{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       v1.PodSpec{TerminationGracePeriodSeconds: &grace},
		}
		for i := range containers {
			pod.Spec.Containers = append(pod.Spec.Containers, v1.Container{Name: fmt.Sprintf("c%d", i), Image: imageRef, Command: podCommand})
		}
		b, err := json.Marshal(pod)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(n.manifests, manifestFile(name)), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// shimRows report the samples: shim count and PSS per layout.
func (m *shimMeasures) rows() []Row {
	if len(m.noderun) == 0 {
		return nil
	}
	of := func(uses []shimUse, f func(shimUse) float64) *Stats {
		var xs []float64
		for _, u := range uses {
			xs = append(xs, f(u))
		}
		return statsOf(xs)
	}
	count := func(u shimUse) float64 { return float64(u.count) }
	pss := func(u shimUse) float64 { return u.pss }
	shape := fmt.Sprintf("%d pods × %d containers", m.pods, m.containers)
	return []Row{
		Row{Key: "shims_multi", Measure: "shims, " + shape + " (floor: one per container)", Unit: "shims",
			Noderun: of(m.noderun, count), Floor: of(m.perContainer, count)}.finish(),
		Row{Key: "shims_multi_grouped", Measure: "shims, " + shape + " (floor: grouped by pod)", Unit: "shims",
			Noderun: of(m.noderun, count), Floor: of(m.grouped, count)}.finish(),
		Row{Key: "pss_shims_multi", Measure: "PSS of the shims, " + shape + " (floor: one per container)", Unit: "MiB",
			Noderun: of(m.noderun, pss), Floor: of(m.perContainer, pss)}.finish(),
		Row{Key: "pss_shims_multi_grouped", Measure: "PSS of the shims, " + shape + " (floor: grouped by pod)", Unit: "MiB",
			Noderun: of(m.noderun, pss), Floor: of(m.grouped, pss)}.finish(),
	}
}
