package runner

import v1 "k8s.io/api/core/v1"

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

// oomScoreAdj follows the kubelet's QoS policy, without the negative score
// for Guaranteed pods' critical containers (the runtime clamps it to its
// own score anyway).
func oomScoreAdj(pod *v1.Pod) int {
	switch QOSClass(pod) {
	case v1.PodQOSGuaranteed:
		return -997
	case v1.PodQOSBestEffort:
		return 1000
	default:
		return 500
	}
}
