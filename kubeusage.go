package main

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/noderun/noderun/internal/cgroups"
	"github.com/noderun/noderun/internal/podstats"
	"github.com/noderun/noderun/runner"
	ctrdrt "github.com/noderun/noderun/runner/containerd"
	v1 "k8s.io/api/core/v1"
)

// podUsage reads the engine's pods' usage for the Kubernetes API, told
// where each pod's cgroups, emptyDirs and logs are, and the containers'
// writable layers by the runtime.
func podUsage(engine *runner.Engine, rt *ctrdrt.Runtime, cfg nodeConfig) *podstats.Collector {
	return podstats.New(podstats.Config{NodeName: cfg.nodeName, Cgroups: cfg.cgroups, NodeDir: cfg.layout.PodLogs,
		Pods: func() []podstats.Pod {
			return usagePods(engine.Pods(), cfg.cgroups, cfg.layout.State, cfg.layout.PodLogs)
		},
		WritableLayer: rt.WritableLayer})
}

// usagePods are the pods with a running container, as the usage
// endpoints read them.
func usagePods(pods []v1.Pod, cg cgroups.Layout, stateDir, podLogDir string) []podstats.Pod {
	var out []podstats.Pod
	for _, p := range pods {
		parent := runner.CgroupParent(cg, &p)
		up := podstats.Pod{Name: p.Name, Namespace: p.Namespace, UID: string(p.UID), Cgroup: parent,
			LogDir: filepath.Join(podLogDir, fmt.Sprintf("%s_%s_%s", p.Namespace, p.Name, p.UID))}
		if p.Status.StartTime != nil {
			up.StartTime = p.Status.StartTime.Time
		}
		statuses := append(append([]v1.ContainerStatus(nil), p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...)
		for _, cs := range statuses {
			id, ok := strings.CutPrefix(cs.ContainerID, "containerd://")
			if cs.State.Running == nil || !ok {
				continue
			}
			up.Containers = append(up.Containers, podstats.Container{Name: cs.Name, ID: id, Image: cs.Image,
				Cgroup: cg.ContainerPath(parent, id), StartTime: cs.State.Running.StartedAt.Time})
		}
		if len(up.Containers) == 0 {
			continue
		}
		for _, v := range p.Spec.Volumes {
			if v.EmptyDir != nil {
				up.Volumes = append(up.Volumes, podstats.Volume{Name: v.Name, Path: runner.EmptyDirPath(stateDir, string(p.UID), v.Name)})
			}
		}
		out = append(out, up)
	}
	return out
}
