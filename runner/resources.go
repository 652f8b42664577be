package runner

import (
	"maps"
	"slices"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	resourcehelper "k8s.io/component-helpers/resource"

	"github.com/noderun/noderun/internal/cgroups"
)

// Resources are a container's cgroup settings, computed as the kubelet
// computes them from requests and limits; the runtime only applies them.
type Resources struct {
	CPUShares   uint64
	CPUQuota    int64  // 0: no CFS limit
	CPUPeriod   uint64 // with CPUQuota
	MemoryLimit int64  // bytes; 0: none
	// NoSwap is the kubelet's default swap behaviour where the host can
	// limit swap: on v1 memory+swap equal to the memory limit (when there
	// is one), on v2 memory.swap.max 0.
	NoSwap bool
	// LimitedSwap (v2 only): memory.swap.max is SwapMax, the kubelet's
	// share of the machine's swap for a Burstable container.
	LimitedSwap bool
	SwapMax     int64
}

// Swap behaviours, as the kubelet's memorySwap.swapBehavior.
const (
	NoSwap      = "NoSwap"
	LimitedSwap = "LimitedSwap"
)

// The kubelet's CFS constants (cm/helpers_linux.go).
const (
	maxShares      = 262144
	quotaPeriod    = 100000 // µs: 100 ms
	minQuotaPeriod = 1000   // the least quota, 1 ms
)

// milliCPUToShares is the kubelet's MilliCPUToShares: 1024 per CPU,
// rounded down, within the kernel's [2, 262144].
func milliCPUToShares(milli int64) uint64 {
	return uint64(min(max(milli*1024/1000, cgroups.MinShares), maxShares))
}

// milliCPUToQuota is the kubelet's MilliCPUToQuota over its 100 ms period,
// at least 1 ms; 0 for no limit.
func milliCPUToQuota(milli int64) int64 {
	if milli == 0 {
		return 0
	}
	return max(milli*quotaPeriod/1000, minQuotaPeriod)
}

// containerResources maps cpu request → shares, cpu limit → CFS quota and
// the memory limit, as the kubelet does.
func containerResources(r v1.ResourceRequirements) Resources {
	var out Resources
	if q, ok := r.Limits[v1.ResourceMemory]; ok && !q.IsZero() {
		out.MemoryLimit = q.Value()
	}
	cpuReq, hasReq := r.Requests[v1.ResourceCPU]
	cpuLim, hasLim := r.Limits[v1.ResourceCPU]
	if !hasReq && hasLim {
		cpuReq, hasReq = cpuLim, true
	}
	out.CPUShares = cgroups.MinShares // as the kubelet gives BestEffort
	if hasReq {
		out.CPUShares = milliCPUToShares(cpuReq.MilliValue())
	}
	if hasLim && !cpuLim.IsZero() {
		out.CPUPeriod = quotaPeriod
		out.CPUQuota = milliCPUToQuota(cpuLim.MilliValue())
	}
	return out
}

// containerResources are c's settings on this node: with NoSwap where the
// host can limit swap, as the kubelet's default swap behaviour, or the
// kubelet's LimitedSwap where it applies.
func (w *podWorker) containerResources(pod *v1.Pod, c *v1.Container) Resources {
	r := containerResources(cgroupRequirements(pod, c))
	r.NoSwap = w.env.noSwap
	if w.env.limitedSwap && limitedSwapApplies(pod, c) {
		if max, ok := swapForBurstable(c.Resources.Requests.Memory().Value(), w.env.cfg.MemoryCapacity, w.env.cfg.SwapCapacity); ok {
			r.NoSwap, r.LimitedSwap, r.SwapMax = false, true, max
		}
	}
	return r
}

// cgroupRequirements are c's requests and limits as the kubelet applies
// them to its cgroup: in a pod with pod-level resources, a cpu or memory
// limit the container lacks is the pod's (getCPULimit, getMemoryLimit),
// and so is its cpu request when it has none.
func cgroupRequirements(pod *v1.Pod, c *v1.Container) v1.ResourceRequirements {
	r := c.Resources
	if !resourcehelper.IsPodLevelResourcesSet(pod) {
		return r
	}
	r.Limits = maps.Clone(r.Limits)
	if r.Limits == nil {
		r.Limits = v1.ResourceList{}
	}
	for _, name := range []v1.ResourceName{v1.ResourceCPU, v1.ResourceMemory} {
		if q := r.Limits[name]; q.IsZero() {
			if pq := pod.Spec.Resources.Limits[name]; !pq.IsZero() {
				r.Limits[name] = pq
			}
		}
	}
	return r
}

// limitedSwapApplies is the kubelet's GetContainerSwapBehavior for a host
// where LimitedSwap can apply (cgroup v2 with the swap controller): a
// container of a Burstable pod with a memory request below its limit
// (or without one), unless the pod is critical. Unlike the kubelet, for
// which every static pod is critical, a noderun pod counts as critical
// only by its priority (system-node-critical, system-cluster-critical, or
// spec.priority at least 2000000000): otherwise no pod could use swap.
func limitedSwapApplies(pod *v1.Pod, c *v1.Container) bool {
	switch pc := pod.Spec.PriorityClassName; {
	case pc == SystemNodeCritical || pc == "system-cluster-critical":
		return false
	case pod.Spec.Priority != nil && *pod.Spec.Priority >= systemCriticalPriority:
		return false
	}
	req, lim := c.Resources.Requests.Memory(), c.Resources.Limits.Memory()
	noMemory := req.IsZero() && lim.IsZero()
	return QOSClass(pod) == v1.PodQOSBurstable && !noMemory && req.Cmp(*lim) != 0
}

// swapForBurstable is the kubelet's calcSwapForBurstablePods: the
// container's memory request's share of the machine's memory, of its swap.
// ok is false where the kubelet falls back to NoSwap: memory unknown, or
// a request above it.
func swapForBurstable(request, memCapacity, swapCapacity int64) (int64, bool) {
	if memCapacity <= 0 || request > memCapacity {
		return 0, false
	}
	return int64(float64(request) / float64(memCapacity) * float64(swapCapacity)), true
}

// podTotals are a pod's requests and limits summed as the kubelet's
// resource helpers sum them (pod-level spec.resources replacing the sums
// of what they set), and whether every container, or the pod, has each
// limit.
type podTotals struct {
	cpuRequest, cpuLimit   int64 // milliCPU
	memoryLimit            int64 // bytes
	cpuLimited, memLimited bool
}

func totalsOf(pod *v1.Pod) podTotals {
	reqs := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
	lims := resourcehelper.PodLimits(pod, resourcehelper.PodResourcesOptions{})
	cpu, mem := limitsDeclared(pod)
	return podTotals{cpuRequest: reqs.Cpu().MilliValue(), cpuLimit: lims.Cpu().MilliValue(), memoryLimit: lims.Memory().Value(),
		cpuLimited: cpu, memLimited: mem}
}

// limitsDeclared is ResourceConfigForPod's test that every container has
// the cpu, the memory limit: each app container, each sidecar (with the
// sidecars before it, as the limits are summed) and each init container
// (with the sidecars started before it); a pod-level limit declares it
// for all.
func limitsDeclared(pod *v1.Pod) (cpu, mem bool) {
	cpu, mem = containerLimitsDeclared(pod)
	if resourcehelper.IsPodLevelResourcesSet(pod) {
		cpu = cpu || !pod.Spec.Resources.Limits.Cpu().IsZero()
		mem = mem || !pod.Spec.Resources.Limits.Memory().IsZero()
	}
	return cpu, mem
}

func containerLimitsDeclared(pod *v1.Pod) (cpu, mem bool) {
	cpu, mem = true, true
	check := func(l v1.ResourceList) {
		cpu = cpu && !l.Cpu().IsZero()
		mem = mem && !l.Memory().IsZero()
	}
	for i := range pod.Spec.Containers {
		check(pod.Spec.Containers[i].Resources.Limits)
	}
	var sidecarCPU, sidecarMem resource.Quantity
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		q, m := c.Resources.Limits.Cpu().DeepCopy(), c.Resources.Limits.Memory().DeepCopy()
		q.Add(sidecarCPU)
		m.Add(sidecarMem)
		if isSidecar(c) {
			sidecarCPU, sidecarMem = q, m
		}
		check(v1.ResourceList{v1.ResourceCPU: q, v1.ResourceMemory: m})
	}
	return cpu, mem
}

// podCgroupResources is the kubelet's ResourceConfigForPod (CFS quota
// enforced, its 100 ms period): Guaranteed pods get shares, quota and
// memory limit; Burstable ones shares, and quota or memory limit only when
// every container has that limit; BestEffort ones MinShares alone.
func podCgroupResources(pod *v1.Pod) cgroups.PodResources {
	qos := QOSClass(pod)
	if qos == v1.PodQOSBestEffort {
		return cgroups.PodResources{CPUShares: cgroups.MinShares}
	}
	t := totalsOf(pod)
	r := cgroups.PodResources{CPUShares: milliCPUToShares(t.cpuRequest)}
	if qos == v1.PodQOSGuaranteed || t.cpuLimited {
		r.CPUQuota, r.CPUPeriod = milliCPUToQuota(t.cpuLimit), quotaPeriod
	}
	if qos == v1.PodQOSGuaranteed || t.memLimited {
		r.Memory = t.memoryLimit
	}
	return r
}

// qosTier is the QoS parent a pod's cgroup goes in.
func qosTier(pod *v1.Pod) cgroups.Tier {
	switch QOSClass(pod) {
	case v1.PodQOSBurstable:
		return cgroups.Burstable
	case v1.PodQOSBestEffort:
		return cgroups.BestEffort
	}
	return cgroups.Guaranteed
}

// The kubelet's oom_score_adj values (pkg/kubelet/qos/policy.go).
const (
	guaranteedOOMScoreAdj = -997
	besteffortOOMScoreAdj = 1000
	// SystemNodeCritical is the priority class whose static pods the
	// kubelet protects as it protects itself (types.IsNodeCriticalPod).
	SystemNodeCritical = "system-node-critical"
)

// oomScoreAdj is the kubelet's GetContainerOOMScoreAdjust for a static pod
// (every noderun pod is one, so critical; only system-node-critical ones
// get the Guaranteed score whatever their QoS), with v1.37's default
// feature gates: KubeletOOMScoreAdjTieBreak and DRANodeAllocatableResources
// are off, PodLevelResources is on. memCapacity is the machine's memory (MemTotal), as
// the kubelet's machineInfo; 0 (unknown) counts every request as nothing.
func oomScoreAdj(pod *v1.Pod, c *v1.Container, memCapacity int64) int {
	if pod.Spec.PriorityClassName == SystemNodeCritical {
		return guaranteedOOMScoreAdj
	}
	switch QOSClass(pod) {
	case v1.PodQOSGuaranteed:
		return guaranteedOOMScoreAdj
	case v1.PodQOSBestEffort:
		return besteffortOOMScoreAdj
	}
	// Burstable: a container using more than it requested is the first to
	// go. A pod-level memory request beyond its containers' is shared
	// among them equally.
	extra := podMemoryBeyondContainers(pod)
	adj := burstableOOMScoreAdj(c.Resources.Requests.Memory().Value()+extra, memCapacity)
	if isInitSidecar(pod, c) {
		// A sidecar goes no earlier than the pod's regular containers: at
		// most the score of the smallest request among them.
		adj = min(adj, burstableOOMScoreAdj(minRegularMemoryRequest(pod)+extra, memCapacity))
	}
	// Above any Guaranteed container's final score, below BestEffort's.
	if adj < 1000+guaranteedOOMScoreAdj {
		return 1000 + guaranteedOOMScoreAdj
	}
	if adj == besteffortOOMScoreAdj {
		return int(adj) - 1
	}
	return int(adj)
}

// podMemoryBeyondContainers is the kubelet's remainingPodMemReqPerContainer:
// the pod-level memory request less the containers' aggregate, divided
// among all containers (0 without a pod-level memory request).
func podMemoryBeyondContainers(pod *v1.Pod) int64 {
	if !resourcehelper.IsPodLevelRequestsSet(pod) || pod.Spec.Resources.Requests.Memory().IsZero() {
		return 0
	}
	aggr := resourcehelper.AggregateContainerRequests(pod, resourcehelper.PodResourcesOptions{})
	left := max(pod.Spec.Resources.Requests.Memory().Value()-aggr.Memory().Value(), 0)
	return left / int64(len(pod.Spec.Containers)+len(pod.Spec.InitContainers))
}

// burstableOOMScoreAdj is 1000 less the request's share of the machine's
// memory, in thousandths, before the clamps.
func burstableOOMScoreAdj(request, memCapacity int64) int64 {
	if memCapacity <= 0 {
		return 1000
	}
	return 1000 - (1000*request)/memCapacity
}

// isInitSidecar: a restartable init container, as the kubelet tells one
// (an init container of that name with restartPolicy Always).
func isInitSidecar(pod *v1.Pod, c *v1.Container) bool {
	return isSidecar(c) && slices.ContainsFunc(pod.Spec.InitContainers, func(ic v1.Container) bool { return ic.Name == c.Name })
}

// minRegularMemoryRequest is the smallest memory request of the pod's
// regular containers.
func minRegularMemoryRequest(pod *v1.Pod) int64 {
	var out int64
	for i, c := range pod.Spec.Containers {
		if r := c.Resources.Requests.Memory().Value(); i == 0 || r < out {
			out = r
		}
	}
	return out
}
