package runner

import (
	"slices"

	v1 "k8s.io/api/core/v1"
)

// Resources are a container's cgroup settings, computed as the kubelet
// computes them from requests and limits; the runtime only applies them.
type Resources struct {
	CPUShares   uint64
	CPUQuota    int64  // 0: no CFS limit
	CPUPeriod   uint64 // with CPUQuota
	MemoryLimit int64  // bytes; 0: none
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
	out.CPUShares = 2 // the kernel's minimum, as the kubelet gives BestEffort
	if hasReq {
		out.CPUShares = max(uint64(cpuReq.MilliValue()*1024/1000), 2)
	}
	if hasLim && !cpuLim.IsZero() {
		out.CPUPeriod = 100000
		out.CPUQuota = max(cpuLim.MilliValue()*int64(out.CPUPeriod)/1000, 1000)
	}
	return out
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
// are off, and pod-level resources, which PodLevelResources would add, are
// refused by manifests. memCapacity is the machine's memory (MemTotal), as
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
	// Burstable: a container using more than it requested is the first to go.
	adj := burstableOOMScoreAdj(c.Resources.Requests.Memory().Value(), memCapacity)
	if isInitSidecar(pod, c) {
		// A sidecar goes no earlier than the pod's regular containers: at
		// most the score of the smallest request among them.
		adj = min(adj, burstableOOMScoreAdj(minRegularMemoryRequest(pod), memCapacity))
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
