// Package podstats reads the node's and its pods' resource usage, on
// request only, from the pods' cgroups, their network namespaces and
// their volumes and log dirs, and hands it on in the kubelet's Summary API
// shape (/stats/summary) and as the kubelet's /metrics/resource and
// /metrics/cadvisor series. It runs nothing in the background: a
// collection is cached for a few seconds, and the last CPU sample of each
// cgroup is kept so that the next one yields a rate over the window
// between them, as metrics-server computes it.
package podstats

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// The types below have the JSON of the kubelet's Summary API
// (k8s.io/kubelet/pkg/apis/stats/v1alpha1), the fields noderun fills:
// that module would bring its own requirements (client-go,
// component-base) into the module graph for a handful of structs.

// Summary is /stats/summary.
type Summary struct {
	Node NodeStats  `json:"node"`
	Pods []PodStats `json:"pods"`
}

// NodeStats is the whole node.
type NodeStats struct {
	NodeName  string        `json:"nodeName"`
	StartTime metav1.Time   `json:"startTime"`
	CPU       *CPUStats     `json:"cpu,omitempty"`
	Memory    *MemoryStats  `json:"memory,omitempty"`
	IO        *IOStats      `json:"io,omitempty"`
	Network   *NetworkStats `json:"network,omitempty"`
	Fs        *FsStats      `json:"fs,omitempty"`
	Rlimit    *RlimitStats  `json:"rlimit,omitempty"`
}

// RlimitStats is the node's process limit and count.
type RlimitStats struct {
	Time                  metav1.Time `json:"time"`
	MaxPID                *int64      `json:"maxpid,omitempty"`
	NumOfRunningProcesses *int64      `json:"curproc,omitempty"`
}

// PodStats is one pod: its cgroup, containers, network and volumes.
type PodStats struct {
	PodRef           PodReference     `json:"podRef"`
	StartTime        metav1.Time      `json:"startTime"`
	Containers       []ContainerStats `json:"containers"`
	CPU              *CPUStats        `json:"cpu,omitempty"`
	Memory           *MemoryStats     `json:"memory,omitempty"`
	IO               *IOStats         `json:"io,omitempty"`
	Network          *NetworkStats    `json:"network,omitempty"`
	VolumeStats      []VolumeStats    `json:"volume,omitempty"`
	EphemeralStorage *FsStats         `json:"ephemeral-storage,omitempty"`
	Swap             *SwapStats       `json:"swap,omitempty"`
}

// ContainerStats is one running container.
type ContainerStats struct {
	Name      string       `json:"name"`
	StartTime metav1.Time  `json:"startTime"`
	CPU       *CPUStats    `json:"cpu,omitempty"`
	Memory    *MemoryStats `json:"memory,omitempty"`
	IO        *IOStats     `json:"io,omitempty"`
	Rootfs    *FsStats     `json:"rootfs,omitempty"`
	Logs      *FsStats     `json:"logs,omitempty"`
	Swap      *SwapStats   `json:"swap,omitempty"`
}

// PodReference names a pod.
type PodReference struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	UID       string `json:"uid"`
}

// InterfaceStats is one network interface's counters.
type InterfaceStats struct {
	Name     string  `json:"name"`
	RxBytes  *uint64 `json:"rxBytes,omitempty"`
	RxErrors *uint64 `json:"rxErrors,omitempty"`
	TxBytes  *uint64 `json:"txBytes,omitempty"`
	TxErrors *uint64 `json:"txErrors,omitempty"`
}

// NetworkStats is the default interface (eth0, inline) and every one.
type NetworkStats struct {
	Time           metav1.Time `json:"time"`
	InterfaceStats `json:",inline"`
	Interfaces     []InterfaceStats `json:"interfaces,omitempty"`
}

// CPUStats: the rate over the last window and the cumulative time.
type CPUStats struct {
	Time                 metav1.Time `json:"time"`
	UsageNanoCores       *uint64     `json:"usageNanoCores,omitempty"`
	UsageCoreNanoSeconds *uint64     `json:"usageCoreNanoSeconds,omitempty"`
	PSI                  *PSIStats   `json:"psi,omitempty"`
}

// MemoryStats: usage, the working set and what the kernel counts.
type MemoryStats struct {
	Time            metav1.Time `json:"time"`
	AvailableBytes  *uint64     `json:"availableBytes,omitempty"`
	UsageBytes      *uint64     `json:"usageBytes,omitempty"`
	WorkingSetBytes *uint64     `json:"workingSetBytes,omitempty"`
	RSSBytes        *uint64     `json:"rssBytes,omitempty"`
	PageFaults      *uint64     `json:"pageFaults,omitempty"`
	MajorPageFaults *uint64     `json:"majorPageFaults,omitempty"`
	PSI             *PSIStats   `json:"psi,omitempty"`
}

// IOStats carries I/O pressure.
type IOStats struct {
	Time metav1.Time `json:"time"`
	PSI  *PSIStats   `json:"psi,omitempty"`
}

// PSIStats is pressure stall information: some and full.
type PSIStats struct {
	Full PSIData `json:"full"`
	Some PSIData `json:"some"`
}

// PSIData is one PSI line: Total in microseconds, averages in percent.
type PSIData struct {
	Total  uint64  `json:"total"`
	Avg10  float64 `json:"avg10"`
	Avg60  float64 `json:"avg60"`
	Avg300 float64 `json:"avg300"`
}

// SwapStats is swap in use.
type SwapStats struct {
	Time           metav1.Time `json:"time"`
	SwapUsageBytes *uint64     `json:"swapUsageBytes,omitempty"`
}

// VolumeStats is one volume's filesystem usage.
type VolumeStats struct {
	FsStats `json:",inline"`
	Name    string `json:"name,omitempty"`
}

// FsStats is a filesystem's, or a directory's, usage.
type FsStats struct {
	Time           metav1.Time `json:"time"`
	AvailableBytes *uint64     `json:"availableBytes,omitempty"`
	CapacityBytes  *uint64     `json:"capacityBytes,omitempty"`
	UsedBytes      *uint64     `json:"usedBytes,omitempty"`
	InodesFree     *uint64     `json:"inodesFree,omitempty"`
	Inodes         *uint64     `json:"inodes,omitempty"`
	InodesUsed     *uint64     `json:"inodesUsed,omitempty"`
}
