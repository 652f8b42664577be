package main

import (
	"testing"

	"github.com/noderun/noderun/internal/cgroups"
	"github.com/noderun/noderun/runner"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The usage endpoints read each running container's cgroup where the
// runtime made it, the pod's parent, its emptyDirs and its log dir; a pod
// with no running container is not read.
func TestUsagePods(t *testing.T) {
	running := v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: metav1.Unix(100, 0)}}
	pod := v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "u1"},
		Spec: v1.PodSpec{Volumes: []v1.Volume{
			{Name: "cache", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
			{Name: "host", VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: "/x"}}},
		}},
		Status: v1.PodStatus{
			InitContainerStatuses: []v1.ContainerStatus{{Name: "sidecar", ContainerID: "containerd://s1", State: running}},
			ContainerStatuses: []v1.ContainerStatus{
				{Name: "app", ContainerID: "containerd://a1", Image: "busybox:1.36", State: running},
				{Name: "done", ContainerID: "containerd://d1", State: v1.ContainerState{Terminated: &v1.ContainerStateTerminated{}}},
			}}}
	stopped := v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "stopped", Namespace: "default", UID: "u2"}}
	for _, cg := range []cgroups.Layout{{Driver: cgroups.Cgroupfs}, {Driver: cgroups.Systemd, Unified: true}} {
		got := usagePods([]v1.Pod{pod, stopped}, cg, "/var/lib/noderun", "/var/log/pods")
		if len(got) != 1 {
			t.Fatalf("%s: %d pods, want only web", cg.Driver, len(got))
		}
		p := got[0]
		parent := cg.PodParent(cgroups.BestEffort, runner.SandboxID("u1")) // no resources: BestEffort
		if p.Cgroup != parent || p.LogDir != "/var/log/pods/default_web_u1" {
			t.Errorf("%s: pod %+v", cg.Driver, p)
		}
		if len(p.Containers) != 2 || p.Containers[1].Name != "app" || p.Containers[1].Cgroup != cg.ContainerPath(parent, "a1") ||
			p.Containers[1].Image != "busybox:1.36" || p.Containers[1].StartTime.Unix() != 100 {
			t.Errorf("%s: containers %+v", cg.Driver, p.Containers)
		}
		if len(p.Volumes) != 1 || p.Volumes[0].Path != runner.EmptyDirPath("/var/lib/noderun", "u1", "cache") {
			t.Errorf("%s: volumes %+v", cg.Driver, p.Volumes)
		}
	}
}
