package kubeapi

import (
	"bufio"
	"bytes"
	"context"
	"maps"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	qty "k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// The kubelet's defaults that shape a Node's allocatable resources and
// pressure conditions (its hard eviction thresholds and maxPods).
const (
	evictionMemoryAvailable = 100 << 20 // memory.available<100Mi
	evictionNodefsPercent   = 10        // nodefs.available<10%
	defaultMaxPods          = 110
	// pidPressurePercent: noderun reports PID pressure when this share of
	// pid_max is in use (the kubelet has no default pid threshold).
	pidPressurePercent = 90
)

// NodeReporter makes this node's Node object from the host (memory, disk,
// kernel, OS, IDs) and from what only noderun knows (its name, labels,
// address, version, containerd's version, its health).
type NodeReporter struct {
	Name, HostIP string
	// Labels are the node's labels: the kubelet's well-known ones and
	// --node-labels.
	Labels map[string]string
	// Version is noderun's version, reported as the kubelet's (semver).
	Version string
	// RuntimeVersion is containerd's version ("1.6.20").
	RuntimeVersion func(ctx context.Context) (string, error)
	// Healthy is nil when noderun is ready (the Ready condition).
	Healthy func(ctx context.Context) error
	// StorageDir is on the filesystem pods' logs and volumes use: the
	// ephemeral-storage and DiskPressure.
	StorageDir string
	Started    time.Time

	mu          sync.Mutex
	runtimeVer  string
	transitions map[v1.NodeConditionType]condState
}

type condState struct {
	status v1.ConditionStatus
	since  time.Time
}

// Resources are the capacity and allocatable resources of a node whose
// pods keep their logs and volumes on the filesystem of storageDir: the
// machine's CPUs and memory, the filesystem's size and the kubelet's
// default maxPods, less the kubelet's default hard eviction thresholds.
func Resources(storageDir string) (capacity, allocatable v1.ResourceList) {
	mem := readMeminfo()
	capacity = v1.ResourceList{
		v1.ResourceCPU:    *qty.NewQuantity(int64(runtime.NumCPU()), qty.DecimalSI),
		v1.ResourceMemory: *qty.NewQuantity(mem["MemTotal"], qty.BinarySI),
		v1.ResourcePods:   *qty.NewQuantity(defaultMaxPods, qty.DecimalSI),
	}
	allocatable = capacity.DeepCopy()
	allocatable[v1.ResourceMemory] = *qty.NewQuantity(max(0, mem["MemTotal"]-evictionMemoryAvailable), qty.BinarySI)
	var fs unix.Statfs_t
	if err := unix.Statfs(storageDir, &fs); err == nil {
		storage := int64(fs.Blocks) * int64(fs.Bsize) // Bsize is an int32 on 32-bit ARM
		capacity[v1.ResourceEphemeralStorage] = *qty.NewQuantity(storage, qty.BinarySI)
		allocatable[v1.ResourceEphemeralStorage] = *qty.NewQuantity(storage-storage*evictionNodefsPercent/100, qty.DecimalSI)
	}
	return capacity, allocatable
}

// Node returns the node as it is now.
func (n *NodeReporter) Node(ctx context.Context) *v1.Node {
	now := time.Now()
	mem := readMeminfo()
	var fs unix.Statfs_t
	fsErr := unix.Statfs(n.StorageDir, &fs)
	capacity, allocatable := Resources(n.StorageDir)
	host, _ := os.Hostname()
	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: n.Name, UID: nodeUID(), CreationTimestamp: metav1.NewTime(n.Started.Truncate(time.Second)),
			Labels: maps.Clone(n.Labels),
		},
		Status: v1.NodeStatus{
			Capacity: capacity, Allocatable: allocatable,
			Phase: v1.NodeRunning,
			NodeInfo: v1.NodeSystemInfo{
				MachineID: readTrimmed("/etc/machine-id"), SystemUUID: readTrimmed("/sys/class/dmi/id/product_uuid"),
				BootID: readTrimmed("/proc/sys/kernel/random/boot_id"), KernelVersion: kernelRelease(),
				OSImage: osImage(), ContainerRuntimeVersion: n.runtimeVersion(ctx),
				KubeletVersion: Semver(n.Version), OperatingSystem: runtime.GOOS, Architecture: runtime.GOARCH,
			},
		},
	}
	if n.HostIP != "" {
		node.Status.Addresses = append(node.Status.Addresses, v1.NodeAddress{Type: v1.NodeInternalIP, Address: n.HostIP})
	}
	if host != "" {
		node.Status.Addresses = append(node.Status.Addresses, v1.NodeAddress{Type: v1.NodeHostName, Address: host})
	}
	memPressure := mem["MemAvailable"] < evictionMemoryAvailable
	diskPressure := fsErr == nil && fs.Blocks > 0 && fs.Bavail*100 < fs.Blocks*evictionNodefsPercent
	// The kubelet's reasons and messages, so describe reads the same.
	pressure := func(t v1.NodeConditionType, on bool, onReason, onMsg, offReason, offMsg string) v1.NodeCondition {
		if on {
			return n.condition(t, v1.ConditionTrue, onReason, onMsg, now)
		}
		return n.condition(t, v1.ConditionFalse, offReason, offMsg, now)
	}
	node.Status.Conditions = []v1.NodeCondition{
		pressure(v1.NodeMemoryPressure, memPressure, "KubeletHasInsufficientMemory", "kubelet has insufficient memory available",
			"KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
		pressure(v1.NodeDiskPressure, diskPressure, "KubeletHasDiskPressure", "kubelet has disk pressure",
			"KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
		pressure(v1.NodePIDPressure, pidPressure(), "KubeletHasInsufficientPID", "kubelet has insufficient PID available",
			"KubeletHasSufficientPID", "kubelet has sufficient PID available"),
	}
	if err := n.Healthy(ctx); err != nil {
		node.Status.Conditions = append(node.Status.Conditions, n.condition(v1.NodeReady, v1.ConditionFalse, "KubeletNotReady", err.Error(), now))
	} else {
		node.Status.Conditions = append(node.Status.Conditions, n.condition(v1.NodeReady, v1.ConditionTrue, "KubeletReady", "noderun is posting ready status", now))
	}
	return node
}

// condition is a node condition with the time its status last changed
// (noderun's start for the first).
func (n *NodeReporter) condition(t v1.NodeConditionType, st v1.ConditionStatus, reason, msg string, now time.Time) v1.NodeCondition {
	n.mu.Lock()
	if n.transitions == nil {
		n.transitions = map[v1.NodeConditionType]condState{}
	}
	last, ok := n.transitions[t]
	if !ok || last.status != st {
		since := now
		if !ok {
			since = n.Started
		}
		last = condState{status: st, since: since}
		n.transitions[t] = last
	}
	n.mu.Unlock()
	return v1.NodeCondition{
		Type: t, Status: st, Reason: reason, Message: msg,
		LastHeartbeatTime: metav1.NewTime(now), LastTransitionTime: metav1.NewTime(last.since.Truncate(time.Second)),
	}
}

func (n *NodeReporter) runtimeVersion(ctx context.Context) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.runtimeVer == "" && n.RuntimeVersion != nil {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if v, err := n.RuntimeVersion(ctx); err == nil {
			n.runtimeVer = "containerd://" + strings.TrimPrefix(v, "v")
		}
	}
	return n.runtimeVer
}

// readMeminfo returns /proc/meminfo's values in bytes.
func readMeminfo() map[string]int64 {
	out := map[string]int64{}
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		fields := strings.Fields(rest)
		if !ok || len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			continue
		}
		if len(fields) > 1 && fields[1] == "kB" {
			v <<= 10
		}
		out[name] = v
	}
	return out
}

// pidPressure compares the tasks in use (/proc/loadavg) with pid_max.
func pidPressure() bool {
	load, err1 := os.ReadFile("/proc/loadavg")
	maxb, err2 := os.ReadFile("/proc/sys/kernel/pid_max")
	if err1 != nil || err2 != nil {
		return false
	}
	fields := strings.Fields(string(load))
	if len(fields) < 4 {
		return false
	}
	_, total, _ := strings.Cut(fields[3], "/")
	used, err1 := strconv.Atoi(total)
	limit, err2 := strconv.Atoi(strings.TrimSpace(string(maxb)))
	return err1 == nil && err2 == nil && limit > 0 && used*100 >= limit*pidPressurePercent
}

func readTrimmed(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return string(bytes.TrimSpace(b))
}

func kernelRelease() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// osImage is os-release's PRETTY_NAME, as the kubelet reports it.
func osImage() string {
	for _, path := range []string{"/etc/os-release", "/usr/lib/os-release"} {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "PRETTY_NAME="); ok {
				if u, err := strconv.Unquote(v); err == nil {
					return u
				}
				return strings.Trim(v, `"'`)
			}
		}
	}
	return ""
}

// nodeUID is stable for the machine: its machine id.
func nodeUID() types.UID { return types.UID(readTrimmed("/etc/machine-id")) }
