package kubeapi

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestPodCells(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ago := func(d time.Duration) metav1.Time { return metav1.NewTime(now.Add(-d)) }
	running := v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: ago(time.Minute)}}
	waiting := func(r string) v1.ContainerState {
		return v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: r}}
	}
	exited := func(code int32, reason string) v1.ContainerState {
		return v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: code, Reason: reason, FinishedAt: ago(5 * time.Second)}}
	}
	always := v1.ContainerRestartPolicyAlways
	pod := func(mod func(*v1.Pod)) *v1.Pod {
		p := &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "p", CreationTimestamp: ago(90 * time.Minute)},
			Spec:       v1.PodSpec{NodeName: "n1", Containers: []v1.Container{{Name: "a"}}},
			Status: v1.PodStatus{Phase: v1.PodRunning, PodIPs: []v1.PodIP{{IP: "10.0.0.5"}},
				ContainerStatuses: []v1.ContainerStatus{{Name: "a", Ready: true, State: running}}},
		}
		mod(p)
		return p
	}
	tests := []struct {
		name string
		pod  *v1.Pod
		want []any
	}{
		{"running", pod(func(*v1.Pod) {}),
			[]any{"p", "1/1", "Running", "0", "90m", "10.0.0.5", "n1", "<none>", "<none>"}},
		{"crash loop", pod(func(p *v1.Pod) {
			p.Status.ContainerStatuses[0] = v1.ContainerStatus{Name: "a", RestartCount: 3, State: waiting("CrashLoopBackOff"),
				LastTerminationState: exited(1, "Error")}
		}), []any{"p", "0/1", "CrashLoopBackOff", "3 (5s ago)", "90m"}},
		{"completed", pod(func(p *v1.Pod) {
			p.Status.Phase = v1.PodSucceeded
			p.Status.ContainerStatuses[0] = v1.ContainerStatus{Name: "a", State: exited(0, "Completed")}
		}), []any{"p", "0/1", "Completed", "0"}},
		{"exit code without reason", pod(func(p *v1.Pod) {
			p.Status.Phase = v1.PodFailed
			p.Status.ContainerStatuses[0] = v1.ContainerStatus{Name: "a", State: exited(2, "")}
		}), []any{"p", "0/1", "ExitCode:2", "0"}},
		{"terminating", pod(func(p *v1.Pod) {
			ts := ago(time.Second)
			p.DeletionTimestamp = &ts
		}), []any{"p", "1/1", "Terminating", "0"}},
		{"init waiting", pod(func(p *v1.Pod) {
			p.Status.Phase = v1.PodPending
			p.Spec.InitContainers = []v1.Container{{Name: "i"}}
			p.Status.InitContainerStatuses = []v1.ContainerStatus{{Name: "i", State: running}}
			p.Status.ContainerStatuses[0] = v1.ContainerStatus{Name: "a", State: waiting("PodInitializing")}
		}), []any{"p", "0/1", "Init:0/1", "0"}},
		{"init crash loop", pod(func(p *v1.Pod) {
			p.Status.Phase = v1.PodPending
			p.Spec.InitContainers = []v1.Container{{Name: "i"}}
			p.Status.InitContainerStatuses = []v1.ContainerStatus{{Name: "i", RestartCount: 2, State: waiting("CrashLoopBackOff"), LastTerminationState: exited(1, "Error")}}
			p.Status.ContainerStatuses[0] = v1.ContainerStatus{Name: "a", State: waiting("PodInitializing")}
		}), []any{"p", "0/1", "Init:CrashLoopBackOff", "2 (5s ago)"}},
		{"init failed", pod(func(p *v1.Pod) {
			p.Status.Phase = v1.PodFailed
			p.Spec.InitContainers = []v1.Container{{Name: "i"}}
			p.Status.InitContainerStatuses = []v1.ContainerStatus{{Name: "i", State: exited(1, "Error")}}
			p.Status.ContainerStatuses[0] = v1.ContainerStatus{Name: "a", State: waiting("PodInitializing")}
		}), []any{"p", "0/1", "Init:Error", "0"}},
		{"sidecar counts as a container", pod(func(p *v1.Pod) {
			p.Spec.InitContainers = []v1.Container{{Name: "side", RestartPolicy: &always}}
			tr := true
			p.Status.InitContainerStatuses = []v1.ContainerStatus{{Name: "side", Ready: true, Started: &tr, State: running, RestartCount: 1, LastTerminationState: exited(1, "Error")}}
			p.Status.Conditions = []v1.PodCondition{{Type: v1.PodInitialized, Status: v1.ConditionTrue}}
		}), []any{"p", "2/2", "Running", "1 (5s ago)"}},
		{"pending", pod(func(p *v1.Pod) {
			p.Status.Phase = v1.PodPending
			p.Status.PodIPs = nil
			p.Status.ContainerStatuses[0] = v1.ContainerStatus{Name: "a", State: waiting("ContainerCreating")}
		}), []any{"p", "0/1", "ContainerCreating", "0", "90m", "<none>"}},
		{"readiness gates", pod(func(p *v1.Pod) {
			p.Spec.ReadinessGates = []v1.PodReadinessGate{{ConditionType: "x"}, {ConditionType: "y"}}
			p.Status.Conditions = []v1.PodCondition{{Type: "x", Status: v1.ConditionTrue}}
		}), []any{"p", "1/1", "Running", "0", "90m", "10.0.0.5", "n1", "<none>", "1/2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := podCells(tt.pod, now)
			if len(got) != len(podColumns) {
				t.Fatalf("%d cells for %d columns", len(got), len(podColumns))
			}
			for i, w := range tt.want {
				if got[i] != w {
					t.Errorf("%s = %v, want %v (row %v)", podColumns[i].Name, got[i], w, got)
				}
			}
		})
	}
}

func TestEventCells(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ev := &v1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: "web.1"},
		InvolvedObject: v1.ObjectReference{Kind: "Pod", Name: "web", FieldPath: "spec.containers{main}"},
		Reason:         "BackOff", Message: "Back-off restarting failed container\n", Type: v1.EventTypeWarning, Count: 4,
		FirstTimestamp: metav1.NewTime(now.Add(-3 * time.Minute)), LastTimestamp: metav1.NewTime(now.Add(-20 * time.Second)),
		Source: v1.EventSource{Component: "noderun", Host: "n1"},
	}
	want := []any{"20s", "Warning", "BackOff", "pod/web", "spec.containers{main}", "noderun, n1",
		"Back-off restarting failed container", "3m", int64(4), "web.1"}
	got := eventCells(ev, now)
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("%s = %v, want %v", eventColumns[i].Name, got[i], want[i])
		}
	}
}

func TestNodeCells(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	n := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1", CreationTimestamp: metav1.NewTime(now.Add(-49 * time.Hour)),
			Labels: map[string]string{"node-role.kubernetes.io/control-plane": "", "kubernetes.io/role": "edge"}},
		Status: v1.NodeStatus{
			Conditions: []v1.NodeCondition{{Type: v1.NodeMemoryPressure, Status: v1.ConditionFalse}, {Type: v1.NodeReady, Status: v1.ConditionFalse}},
			Addresses:  []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.0.2.1"}},
			NodeInfo:   v1.NodeSystemInfo{KubeletVersion: "v0.0.0-abc", KernelVersion: "6.1.0", ContainerRuntimeVersion: "containerd://1.6.20"},
		},
	}
	want := []any{"n1", "NotReady", "control-plane,edge", "2d1h", "v0.0.0-abc", "192.0.2.1", "<none>", "<unknown>", "6.1.0", "containerd://1.6.20"}
	got := nodeCells(n, now)
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("%s = %v, want %v", nodeColumns[i].Name, got[i], want[i])
		}
	}
}
