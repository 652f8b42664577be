package e2e

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// fillMiB is what the usage pod's "mem" container holds in memory: a
// file in the pod's /dev/shm, whose pages are charged to its cgroup and
// are never inactive file cache.
const fillMiB, rootFillMiB = 40, 3

// usagePod has a container that burns CPU, one that idles, and one that
// holds fillMiB MiB and writes 1 MiB to its emptyDir and rootFillMiB MiB
// to its rootfs.
const usagePod = `apiVersion: v1
kind: Pod
metadata:
  name: usage
  labels: {app: usage}
spec:
  terminationGracePeriodSeconds: 2
  volumes:
  - name: scratch
    emptyDir: {}
  containers:
  - name: spin
    image: busybox:1.36
    command: ["sh", "-c", "while :; do :; done"]
  - name: idle
    image: busybox:1.36
    command: ["sh", "-c", '` + untilTerm + `']
  - name: mem
    image: busybox:1.36
    command: ["sh", "-c", 'head -c 41943040 /dev/zero > /dev/shm/fill && head -c 1048576 /dev/zero > /scratch/f && head -c 3145728 /dev/zero > /rootfill && echo filled && ` + untilTerm + `']
    volumeMounts:
    - {name: scratch, mountPath: /scratch}
`

// topRow finds the row of `kubectl top pod -A --containers` for a
// container: NAMESPACE POD NAME CPU MEMORY.
func topRow(out, pod, container string) []string {
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) >= 5 && f[1] == pod && f[2] == container {
			return f
		}
	}
	return nil
}

// startUsagePod starts a node running usagePod, once its memory is held,
// and returns its view kubeconfig.
func startUsagePod(t *testing.T) (*node, *v1.Pod, string) {
	n := newNode(t)
	n.writeManifest("usage.yaml", usagePod)
	p := n.waitPod("usage", "Running", running)
	n.waitLogLine(n.logPath(p, "mem", 0), "filled")
	return n, p, n.kubeconfig(false)
}

func quantity(t *testing.T, s string) *resource.Quantity {
	t.Helper()
	q, err := resource.ParseQuantity(s)
	if err != nil {
		t.Fatalf("quantity %q: %v", s, err)
	}
	return &q
}

// `kubectl top pod` and `kubectl top node` work against the node with the
// view token: a container that burns CPU shows more than an idle one,
// one that holds N MiB shows at least N MiB of working set, and the node
// shows its usage.
func TestKubectlTop(t *testing.T) {
	t.Parallel()
	n, _, view := startUsagePod(t)

	out := n.kubectlOK(view, "top", "pod", "-A", "--containers")
	t.Logf("kubectl top pod -A --containers:\n%s", out)
	if h := strings.Join(strings.Fields(strings.SplitN(out, "\n", 2)[0]), " "); !strings.HasPrefix(h, "NAMESPACE POD NAME CPU(cores) MEMORY(bytes)") {
		t.Errorf("header %q\n%s", h, out)
	}
	spin, idle, mem := topRow(out, "usage-e2e", "spin"), topRow(out, "usage-e2e", "idle"), topRow(out, "usage-e2e", "mem")
	if spin == nil || idle == nil || mem == nil {
		t.Fatalf("rows for spin, idle and mem:\n%s", out)
	}
	if quantity(t, spin[3]).Cmp(*quantity(t, idle[3])) <= 0 || quantity(t, spin[3]).MilliValue() < 10 {
		t.Errorf("spin uses %s CPU, idle %s: the busy loop should show more\n%s", spin[3], idle[3], out)
	}
	if ws := quantity(t, mem[4]).Value(); ws < fillMiB<<20 {
		t.Errorf("mem's working set %s, want ≥ %d Mi\n%s", mem[4], fillMiB, out)
	}

	// A label selector, a namespace and a name, as the Metrics API serves them.
	if out := n.kubectlOK(view, "top", "pod", "-l", "app=usage"); !strings.Contains(out, "usage-e2e") {
		t.Errorf("top pod -l app=usage:\n%s", out)
	}
	if out, errOut, _ := n.kubectl(view, "top", "pod", "-l", "app=none"); strings.Contains(out, "usage-e2e") || !strings.Contains(errOut, "No resources found") {
		t.Errorf("top pod -l app=none: %s%s", out, errOut)
	}
	if out := n.kubectlOK(view, "top", "pod", "usage-e2e", "-n", "default"); !strings.Contains(out, "usage-e2e") {
		t.Errorf("top pod usage-e2e:\n%s", out)
	}

	nodeOut := n.kubectlOK(view, "top", "node")
	t.Logf("kubectl top node:\n%s", nodeOut)
	row := podRow(nodeOut, nodeName)
	if len(row) < 5 || !regexp.MustCompile(`^[0-9]+m$`).MatchString(row[1]) || !strings.HasSuffix(row[2], "%") ||
		quantity(t, row[3]).Value() < fillMiB<<20 {
		t.Errorf("top node row %q: want NAME CPU CPU%% MEMORY MEMORY%%\n%s", row, nodeOut)
	}
}

// summary is the part of the kubelet's Summary API (stats/v1alpha1) the
// test reads; unknown fields are refused, so a field noderun spells
// differently from the kubelet fails it.
type summary struct {
	Node struct {
		NodeName string `json:"nodeName"`
		CPU      struct {
			UsageCoreNanoSeconds *uint64 `json:"usageCoreNanoSeconds"`
		} `json:"cpu"`
		Memory struct {
			WorkingSetBytes *uint64 `json:"workingSetBytes"`
		} `json:"memory"`
	} `json:"node"`
	Pods []struct {
		PodRef     struct{ Name, Namespace, UID string } `json:"podRef"`
		Containers []struct {
			Name   string `json:"name"`
			Memory struct {
				WorkingSetBytes *uint64 `json:"workingSetBytes"`
			} `json:"memory"`
			Logs *struct {
				UsedBytes *uint64 `json:"usedBytes"`
			} `json:"logs"`
			Rootfs *struct {
				UsedBytes     *uint64 `json:"usedBytes"`
				InodesUsed    *uint64 `json:"inodesUsed"`
				CapacityBytes *uint64 `json:"capacityBytes"`
			} `json:"rootfs"`
		} `json:"containers"`
		Network *struct {
			Name    string  `json:"name"`
			RxBytes *uint64 `json:"rxBytes"`
		} `json:"network"`
		Volume []struct {
			Name      string  `json:"name"`
			UsedBytes *uint64 `json:"usedBytes"`
		} `json:"volume"`
		EphemeralStorage *struct {
			UsedBytes *uint64 `json:"usedBytes"`
		} `json:"ephemeral-storage"`
	} `json:"pods"`
}

// /stats/summary, /metrics/resource and /metrics/cadvisor answer the view
// token with the kubelet's shape, names and labels, at the kubelet's
// paths and through the node proxy paths.
func TestUsageEndpoints(t *testing.T) {
	t.Parallel()
	n, p, view := startUsagePod(t)

	raw := n.kubectlOK(view, "get", "--raw", "/stats/summary")
	var s summary
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		t.Fatalf("summary: %v\n%s", err, raw)
	}
	if s.Node.NodeName != nodeName || s.Node.CPU.UsageCoreNanoSeconds == nil || s.Node.Memory.WorkingSetBytes == nil {
		t.Errorf("node stats %+v", s.Node)
	}
	found := false
	for _, ps := range s.Pods {
		if ps.PodRef.Name != "usage-e2e" || ps.PodRef.UID != string(p.UID) {
			continue
		}
		found = true
		names := map[string]bool{}
		var rootfs uint64
		for _, c := range ps.Containers {
			names[c.Name] = true
			if c.Name == "mem" && (c.Memory.WorkingSetBytes == nil || *c.Memory.WorkingSetBytes < fillMiB<<20) {
				t.Errorf("mem working set %v", c.Memory.WorkingSetBytes)
			}
			if c.Logs == nil || c.Logs.UsedBytes == nil {
				t.Errorf("container %s has no log usage", c.Name)
			}
			if r := c.Rootfs; r == nil || r.UsedBytes == nil || r.InodesUsed == nil || r.CapacityBytes == nil || *r.CapacityBytes == 0 {
				t.Errorf("container %s's rootfs %+v, want its writable layer's use and its filesystem's capacity", c.Name, r)
			} else if c.Name == "mem" && (*r.UsedBytes < rootFillMiB<<20 || *r.InodesUsed < 1) {
				t.Errorf("mem's rootfs uses %d bytes, %d inodes; want ≥ %d MiB and its file", *r.UsedBytes, *r.InodesUsed, rootFillMiB)
			} else if c.Name == "mem" {
				rootfs = *r.UsedBytes
			}
		}
		if !names["spin"] || !names["idle"] || !names["mem"] {
			t.Errorf("containers %v", names)
		}
		if ps.Network == nil || ps.Network.Name != "eth0" || ps.Network.RxBytes == nil {
			t.Errorf("network %+v", ps.Network)
		}
		if len(ps.Volume) != 1 || ps.Volume[0].Name != "scratch" || *ps.Volume[0].UsedBytes < 1<<20 {
			t.Errorf("volumes %+v", ps.Volume)
		}
		// The kubelet's: the containers' rootfs and logs, and disk-backed volumes.
		if ps.EphemeralStorage == nil || *ps.EphemeralStorage.UsedBytes < 1<<20+rootfs {
			t.Errorf("ephemeral storage %+v, want at least the emptyDir's 1 MiB and mem's rootfs (%d bytes)", ps.EphemeralStorage, rootfs)
		}
	}
	if !found {
		t.Errorf("no usage-e2e in the summary:\n%s", raw)
	}

	resourceOut := n.kubectlOK(view, "get", "--raw", "/api/v1/nodes/"+nodeName+"/proxy/metrics/resource")
	for _, want := range []string{
		`container_cpu_usage_seconds_total{container="spin",namespace="default",pod="usage-e2e"} `,
		`container_memory_working_set_bytes{container="mem",namespace="default",pod="usage-e2e"} `,
		`container_start_time_seconds{container="idle",namespace="default",pod="usage-e2e"} `,
		`pod_cpu_usage_seconds_total{namespace="default",pod="usage-e2e"} `,
		"node_cpu_usage_seconds_total ", "node_memory_working_set_bytes ", "resource_scrape_error 0",
	} {
		if !strings.Contains(resourceOut, want) {
			t.Errorf("/metrics/resource lacks %q:\n%s", want, resourceOut)
		}
	}
	cadvisorOut := n.kubectlOK(view, "get", "--raw", "/metrics/cadvisor")
	id := containerID(p.Status.ContainerStatuses[0])
	for _, name := range []string{"container_cpu_usage_seconds_total", "container_memory_working_set_bytes", "container_start_time_seconds",
		"container_memory_rss", "container_network_receive_bytes_total"} {
		re := regexp.MustCompile("(?m)^" + name + `\{[^}]*pod="usage-e2e"[^}]*\} [0-9.e+]+`)
		if !re.MatchString(cadvisorOut) {
			t.Errorf("/metrics/cadvisor has no %s for usage-e2e", name)
		}
	}
	if !strings.Contains(cadvisorOut, `name="`+id+`"`) || !strings.Contains(cadvisorOut, `cpu="total"`) {
		t.Errorf("/metrics/cadvisor lacks the container ID %s as name, or cpu=\"total\"", id)
	}
	if bytes.Contains([]byte(cadvisorOut), []byte("container_pressure_")) != unifiedCgroups() {
		t.Errorf("PSI series on a unified host only: unified=%v", unifiedCgroups())
	}
}

// unifiedCgroups: the host has cgroup v2 only, where cAdvisor reads PSI.
func unifiedCgroups() bool {
	var st unix.Statfs_t
	return unix.Statfs("/sys/fs/cgroup", &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
}
