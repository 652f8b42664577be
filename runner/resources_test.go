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

func TestOOMScoreAdjByQoS(t *testing.T) {
	q := func(req, lim string) *v1.Pod {
		c := v1.Container{Name: "a"}
		if req != "" {
			c.Resources.Requests = v1.ResourceList{v1.ResourceMemory: resource.MustParse(req)}
		}
		if lim != "" {
			c.Resources.Limits = v1.ResourceList{v1.ResourceMemory: resource.MustParse(lim), v1.ResourceCPU: resource.MustParse("1")}
			c.Resources.Requests = v1.ResourceList{v1.ResourceMemory: resource.MustParse(lim), v1.ResourceCPU: resource.MustParse("1")}
		}
		return &v1.Pod{Spec: v1.PodSpec{Containers: []v1.Container{c}}}
	}
	for _, tc := range []struct {
		pod  *v1.Pod
		want int
	}{{q("", ""), 1000}, {q("64Mi", ""), 500}, {q("", "64Mi"), -997}} {
		if got := oomScoreAdj(tc.pod); got != tc.want {
			t.Errorf("%v: got %d, want %d", QOSClass(tc.pod), got, tc.want)
		}
	}
}
