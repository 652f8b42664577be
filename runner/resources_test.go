package runner

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func TestContainerResources(t *testing.T) {
	r := v1.ResourceRequirements{
		Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("250m")},
		Limits:   v1.ResourceList{v1.ResourceCPU: resource.MustParse("500m"), v1.ResourceMemory: resource.MustParse("64Mi")},
	}
	want := Resources{CPUShares: 256, CPUQuota: 50000, CPUPeriod: 100000, MemoryLimit: 64 << 20}
	if got := containerResources(r); got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	limitOnly := v1.ResourceRequirements{Limits: v1.ResourceList{v1.ResourceCPU: resource.MustParse("2")}}
	if got := containerResources(limitOnly); got.CPUShares != 2048 || got.CPUQuota != 200000 {
		t.Errorf("a cpu limit alone is also the request: %+v", got)
	}
	if got := containerResources(v1.ResourceRequirements{}); got != (Resources{CPUShares: 2}) {
		t.Errorf("BestEffort: %+v, want shares 2 and nothing else", got)
	}
}

// The kubelet's own cases (pkg/kubelet/qos/policy_test.go, v1.37, gates at
// their defaults), each container's score as the kubelet computes it.
func TestOOMScoreAdjAsTheKubelet(t *testing.T) {
	const standard = 8000000000
	mem := func(req, lim string) v1.ResourceRequirements {
		var r v1.ResourceRequirements
		if req != "" {
			r.Requests = v1.ResourceList{v1.ResourceMemory: resource.MustParse(req)}
		}
		if lim != "" {
			r.Limits = v1.ResourceList{v1.ResourceMemory: resource.MustParse(lim)}
		}
		return r
	}
	always := v1.ContainerRestartPolicyAlways
	sidecar := func(name, req string) v1.Container {
		return v1.Container{Name: name, RestartPolicy: &always, Resources: mem(req, "1000001000")}
	}
	initC := v1.Container{Name: "init-container", Resources: mem("1G", "1000001000")}
	main1 := v1.Container{Name: "main-1", Resources: mem("1G", "1000001000")}
	guaranteed := v1.ResourceRequirements{
		Requests: v1.ResourceList{v1.ResourceMemory: resource.MustParse("10G"), v1.ResourceCPU: resource.MustParse("5m")},
		Limits:   v1.ResourceList{v1.ResourceMemory: resource.MustParse("10G"), v1.ResourceCPU: resource.MustParse("5m")},
	}
	for _, tc := range []struct {
		name     string
		spec     v1.PodSpec
		capacity int64
		want     map[string]int
	}{
		{"cpu limit", v1.PodSpec{Containers: []v1.Container{{Name: "c", Resources: v1.ResourceRequirements{
			Limits: v1.ResourceList{v1.ResourceCPU: resource.MustParse("10")}}}}}, 4000000000, map[string]int{"c": 999}},
		{"memory limit, cpu request 0", v1.PodSpec{Containers: []v1.Container{{Name: "c", Resources: v1.ResourceRequirements{
			Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("0")},
			Limits:   v1.ResourceList{v1.ResourceMemory: resource.MustParse("10G")}}}}}, standard, map[string]int{"c": 999}},
		{"zero memory limit", v1.PodSpec{Containers: []v1.Container{{Name: "c", Resources: mem("", "0")}}}, 7230457451, map[string]int{"c": 1000}},
		{"no request or limit", v1.PodSpec{Containers: []v1.Container{{Name: "c"}}}, 4000000000, map[string]int{"c": 1000}},
		{"equal request and limit", v1.PodSpec{Containers: []v1.Container{{Name: "c", Resources: guaranteed}}}, 123456789, map[string]int{"c": -997}},
		{"half the memory", v1.PodSpec{Containers: []v1.Container{{Name: "c", Resources: mem("4000000000", "10G")}}}, standard, map[string]int{"c": 500}},
		{"request of nearly all memory", v1.PodSpec{Containers: []v1.Container{{Name: "c", Resources: mem("7999999999", "")}}}, standard, map[string]int{"c": 3}},
		{"system-cluster-critical is not node-critical", v1.PodSpec{PriorityClassName: "system-cluster-critical",
			Containers: []v1.Container{{Name: "c"}}}, 4000000000, map[string]int{"c": 1000}},
		{"system-node-critical", v1.PodSpec{PriorityClassName: SystemNodeCritical,
			Containers: []v1.Container{{Name: "c"}}}, 4000000000, map[string]int{"c": -997}},
		{"one burstable container", v1.PodSpec{Containers: []v1.Container{main1}}, standard, map[string]int{"main-1": 875}},
		{"init and main", v1.PodSpec{InitContainers: []v1.Container{initC}, Containers: []v1.Container{main1}}, standard,
			map[string]int{"init-container": 875, "main-1": 875}},
		{"small sidecar is held at the main's score", v1.PodSpec{InitContainers: []v1.Container{initC, sidecar("sidecar-small", "400000000")},
			Containers: []v1.Container{main1}}, standard, map[string]int{"init-container": 875, "sidecar-small": 875, "main-1": 875}},
		{"same-size sidecar", v1.PodSpec{InitContainers: []v1.Container{initC, sidecar("sidecar", "1G")},
			Containers: []v1.Container{main1}}, standard, map[string]int{"init-container": 875, "sidecar": 875, "main-1": 875}},
		{"big sidecar keeps its own", v1.PodSpec{InitContainers: []v1.Container{initC, sidecar("sidecar-big", "4G")},
			Containers: []v1.Container{main1}}, standard, map[string]int{"init-container": 875, "sidecar-big": 500, "main-1": 875}},
		{"unknown capacity", v1.PodSpec{Containers: []v1.Container{main1}}, 0, map[string]int{"main-1": 999}},
	} {
		pod := &v1.Pod{Spec: tc.spec}
		for _, c := range allContainers(pod) {
			if got := oomScoreAdj(pod, c, tc.capacity); got != tc.want[c.Name] {
				t.Errorf("%s: %s: got %d, want %d", tc.name, c.Name, got, tc.want[c.Name])
			}
		}
	}
}
