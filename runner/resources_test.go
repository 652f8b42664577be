package runner

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/noderun/noderun/internal/cgroups"
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

// The kubelet's conversions (cm/helpers_linux.go), at the values its own
// tests check: shares round down and stay within [2, 262144]; quota is
// over a 100 ms period and at least 1 ms.
func TestMilliCPUConversions(t *testing.T) {
	for milli, want := range map[int64]uint64{0: 2, 1: 2, 2: 2, 100: 102, 250: 256, 1000: 1024, 1500: 1536, 256000: 262144, 300000: 262144} {
		if got := milliCPUToShares(milli); got != want {
			t.Errorf("milliCPUToShares(%d) = %d, want %d", milli, got, want)
		}
	}
	for milli, want := range map[int64]int64{0: 0, 5: 1000, 9: 1000, 10: 1000, 100: 10000, 200: 20000, 1500: 150000} {
		if got := milliCPUToQuota(milli); got != want {
			t.Errorf("milliCPUToQuota(%d) = %d, want %d", milli, got, want)
		}
	}
}

func res(cpuReq, cpuLim, memReq, memLim string) v1.ResourceRequirements {
	var r v1.ResourceRequirements
	set := func(l *v1.ResourceList, name v1.ResourceName, v string) {
		if v == "" {
			return
		}
		if *l == nil {
			*l = v1.ResourceList{}
		}
		(*l)[name] = resource.MustParse(v)
	}
	set(&r.Requests, v1.ResourceCPU, cpuReq)
	set(&r.Limits, v1.ResourceCPU, cpuLim)
	set(&r.Requests, v1.ResourceMemory, memReq)
	set(&r.Limits, v1.ResourceMemory, memLim)
	return r
}

// The pod cgroup's limits as the kubelet's ResourceConfigForPod computes
// them (its TestResourceConfigForPod cases, with sidecars and init
// containers as its resource helpers sum them).
func TestPodCgroupResources(t *testing.T) {
	always := v1.ContainerRestartPolicyAlways
	ctr := func(r v1.ResourceRequirements) v1.Container { return v1.Container{Name: "c", Resources: r} }
	sidecar := func(r v1.ResourceRequirements) v1.Container {
		return v1.Container{Name: "s", Resources: r, RestartPolicy: &always}
	}
	const mi = 1 << 20
	for _, tc := range []struct {
		name       string
		init, main []v1.Container
		want       cgroups.PodResources
		tier       cgroups.Tier
	}{
		{"besteffort", nil, []v1.Container{ctr(res("", "", "", ""))},
			cgroups.PodResources{CPUShares: 2}, cgroups.BestEffort},
		{"burstable, no limits", nil, []v1.Container{ctr(res("100m", "", "100Mi", ""))},
			cgroups.PodResources{CPUShares: 102}, cgroups.Burstable},
		{"burstable with limits", nil, []v1.Container{ctr(res("100m", "200m", "100Mi", "200Mi"))},
			cgroups.PodResources{CPUShares: 102, CPUQuota: 20000, CPUPeriod: 100000, Memory: 200 * mi}, cgroups.Burstable},
		{"burstable, one container unlimited", nil,
			[]v1.Container{ctr(res("100m", "200m", "100Mi", "200Mi")), ctr(res("100m", "", "100Mi", ""))},
			cgroups.PodResources{CPUShares: 204}, cgroups.Burstable},
		{"burstable, memory limited everywhere, cpu not", nil,
			[]v1.Container{ctr(res("100m", "", "100Mi", "200Mi")), ctr(res("100m", "", "100Mi", "100Mi"))},
			cgroups.PodResources{CPUShares: 204, Memory: 300 * mi}, cgroups.Burstable},
		{"guaranteed", nil, []v1.Container{ctr(res("100m", "100m", "100Mi", "100Mi"))},
			cgroups.PodResources{CPUShares: 102, CPUQuota: 10000, CPUPeriod: 100000, Memory: 100 * mi}, cgroups.Guaranteed},
		{"guaranteed, two containers summed", nil,
			[]v1.Container{ctr(res("500m", "500m", "64Mi", "64Mi")), ctr(res("250m", "250m", "32Mi", "32Mi"))},
			cgroups.PodResources{CPUShares: 768, CPUQuota: 75000, CPUPeriod: 100000, Memory: 96 * mi}, cgroups.Guaranteed},
		{"an init container above the app containers counts alone",
			[]v1.Container{ctr(res("2", "2", "1Gi", "1Gi"))}, []v1.Container{ctr(res("500m", "500m", "64Mi", "64Mi"))},
			cgroups.PodResources{CPUShares: 2048, CPUQuota: 200000, CPUPeriod: 100000, Memory: 1024 * mi}, cgroups.Guaranteed},
		{"a sidecar adds to the app containers and to the init containers after it",
			[]v1.Container{sidecar(res("200m", "200m", "20Mi", "20Mi")), ctr(res("500m", "500m", "50Mi", "50Mi"))},
			[]v1.Container{ctr(res("100m", "100m", "10Mi", "10Mi"))},
			cgroups.PodResources{CPUShares: 716, CPUQuota: 70000, CPUPeriod: 100000, Memory: 70 * mi}, cgroups.Guaranteed},
		{"an init container without limits leaves the pod unlimited",
			[]v1.Container{ctr(res("100m", "", "", ""))}, []v1.Container{ctr(res("100m", "1", "10Mi", "20Mi"))},
			cgroups.PodResources{CPUShares: 102}, cgroups.Burstable},
		{"an init container after a limited sidecar has its limits",
			[]v1.Container{sidecar(res("100m", "1", "10Mi", "20Mi")), ctr(res("100m", "", "", ""))},
			[]v1.Container{ctr(res("100m", "1", "10Mi", "20Mi"))},
			cgroups.PodResources{CPUShares: 204, CPUQuota: 200000, CPUPeriod: 100000, Memory: 40 * mi}, cgroups.Burstable},
	} {
		pod := &v1.Pod{Spec: v1.PodSpec{InitContainers: tc.init, Containers: tc.main}}
		if got := podCgroupResources(pod); got != tc.want {
			t.Errorf("%s: got %+v, want %+v", tc.name, got, tc.want)
		}
		if got := qosTier(pod); got != tc.tier {
			t.Errorf("%s: tier %q, want %q", tc.name, got, tc.tier)
		}
	}
}

// TestSwapForBurstable is the kubelet's calcSwapForBurstablePods: the
// request's share of memory, of the swap; NoSwap when it cannot be had.
func TestSwapForBurstable(t *testing.T) {
	gi := int64(1 << 30)
	for _, tc := range []struct {
		name               string
		request, mem, swap int64
		want               int64
		ok                 bool
	}{
		{"a quarter of memory gets a quarter of swap", gi, 4 * gi, 2 * gi, gi / 2, true},
		{"rounded down", 1, 3, 100, 33, true},
		{"no swap on the machine", gi, 4 * gi, 0, 0, true},
		{"request above memory", 5 * gi, 4 * gi, gi, 0, false},
		{"memory unknown", gi, 0, gi, 0, false},
	} {
		got, ok := swapForBurstable(tc.request, tc.mem, tc.swap)
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s: %d, %v; want %d, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

// TestLimitedSwapApplies is the kubelet's GetContainerSwapBehavior on a
// host where LimitedSwap can apply.
func TestLimitedSwapApplies(t *testing.T) {
	res := func(req, lim string) v1.ResourceRequirements {
		r := v1.ResourceRequirements{Requests: v1.ResourceList{}, Limits: v1.ResourceList{}}
		if req != "" {
			r.Requests[v1.ResourceMemory] = resource.MustParse(req)
		}
		if lim != "" {
			r.Limits[v1.ResourceMemory] = resource.MustParse(lim)
		}
		return r
	}
	critical := int32(2000000000)
	for _, tc := range []struct {
		name string
		r    v1.ResourceRequirements
		set  func(*v1.Pod)
		want bool
	}{
		{"burstable, request below limit", res("64Mi", "128Mi"), nil, true},
		{"burstable, request only", res("64Mi", ""), nil, true},
		{"request equal to limit (Guaranteed)", res("64Mi", "64Mi"), nil, false},
		{"no memory at all (BestEffort)", res("", ""), nil, false},
		{"system-node-critical", res("64Mi", "128Mi"), func(p *v1.Pod) { p.Spec.PriorityClassName = SystemNodeCritical }, false},
		{"system-cluster-critical", res("64Mi", "128Mi"), func(p *v1.Pod) { p.Spec.PriorityClassName = "system-cluster-critical" }, false},
		{"critical priority", res("64Mi", "128Mi"), func(p *v1.Pod) { p.Spec.Priority = &critical }, false},
	} {
		pod := &v1.Pod{Spec: v1.PodSpec{Containers: []v1.Container{{Name: "a", Resources: tc.r}}}}
		if tc.set != nil {
			tc.set(pod)
		}
		if got := limitedSwapApplies(pod, &pod.Spec.Containers[0]); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestPodLevelResources: with spec.resources (PodLevelResources, on in
// v1.37) the pod's QoS comes from the pod-level values alone, its cgroup
// from them (ResourceConfigForPod), containers without a limit take the
// pod's, and a pod-level memory request beyond the containers' is shared
// out in their OOM scores.
func TestPodLevelResources(t *testing.T) {
	const mi = 1 << 20
	for _, tc := range []struct {
		name      string
		pod, ctr  v1.ResourceRequirements
		want      cgroups.PodResources
		qos       v1.PodQOSClass
		container Resources
	}{
		{"requests equal limits: Guaranteed, the containers' unlimited ones take the pod's", res("1", "1", "128Mi", "128Mi"), res("", "", "", ""),
			cgroups.PodResources{CPUShares: 1024, CPUQuota: 100000, CPUPeriod: 100000, Memory: 128 * mi}, v1.PodQOSGuaranteed,
			Resources{CPUShares: 1024, CPUQuota: 100000, CPUPeriod: 100000, MemoryLimit: 128 * mi}},
		{"limits alone (no defaulting for a static pod): Burstable, limited", res("", "1", "", "128Mi"), res("100m", "", "", ""),
			cgroups.PodResources{CPUShares: 102, CPUQuota: 100000, CPUPeriod: 100000, Memory: 128 * mi}, v1.PodQOSBurstable,
			Resources{CPUShares: 102, CPUQuota: 100000, CPUPeriod: 100000, MemoryLimit: 128 * mi}},
		{"requests alone: Burstable, shares from the pod's request", res("500m", "", "64Mi", ""), res("", "", "", ""),
			cgroups.PodResources{CPUShares: 512}, v1.PodQOSBurstable,
			Resources{CPUShares: 2}},
		{"pod-level memory only, containers' cpu ignored for QoS", res("", "", "64Mi", "64Mi"), res("1", "1", "", ""),
			cgroups.PodResources{CPUShares: 1024, CPUQuota: 100000, CPUPeriod: 100000, Memory: 64 * mi}, v1.PodQOSBurstable,
			Resources{CPUShares: 1024, CPUQuota: 100000, CPUPeriod: 100000, MemoryLimit: 64 * mi}},
	} {
		pod := &v1.Pod{Spec: v1.PodSpec{Resources: &tc.pod, Containers: []v1.Container{{Name: "c", Resources: tc.ctr}}}}
		if got := QOSClass(pod); got != tc.qos {
			t.Errorf("%s: QoS %s, want %s", tc.name, got, tc.qos)
		}
		if got := podCgroupResources(pod); got != tc.want {
			t.Errorf("%s: pod cgroup %+v, want %+v", tc.name, got, tc.want)
		}
		if got := containerResources(cgroupRequirements(pod, &pod.Spec.Containers[0])); got != tc.container {
			t.Errorf("%s: container %+v, want %+v", tc.name, got, tc.container)
		}
	}
	// 1 GiB of pod memory request, 256 MiB of it the containers': the rest
	// split over two, on a 4 GiB machine.
	pod := &v1.Pod{Spec: v1.PodSpec{Resources: &v1.ResourceRequirements{Requests: v1.ResourceList{v1.ResourceMemory: resource.MustParse("1Gi")}},
		Containers: []v1.Container{{Name: "a", Resources: res("", "", "256Mi", "")}, {Name: "b"}}}}
	if got, want := oomScoreAdj(pod, &pod.Spec.Containers[1], 4<<30), 1000-1000*(384*mi)/(4<<30); got != int(want) {
		t.Errorf("b's oom_score_adj %d, want %d (its 384 MiB share of the pod's request)", got, want)
	}
}
