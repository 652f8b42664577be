package podstats

import (
	"bufio"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/noderun/noderun/internal/cgroups"
	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func ptr[T any](v T) *T { return &v }

// defaultInterface is the interface the Summary reports inline, as the
// kubelet's (network.DefaultInterfaceName).
const defaultInterface = "eth0"

func (c *Collector) nodeStats(at time.Time, u cgroups.Usage, rate *uint64) NodeStats {
	t := metav1.NewTime(at)
	n := NodeStats{NodeName: c.cfg.NodeName, StartTime: metav1.NewTime(c.bootTime()),
		CPU: cpuStats(t, u, rate), Memory: memoryStats(t, u), IO: ioStats(t, u)}
	if ifs, err := readNetDev(filepath.Join(c.cfg.ProcDir, "net", "dev")); err == nil {
		n.Network = networkStats(t, ifs)
	}
	if c.cfg.NodeDir != "" {
		n.Fs = statfs(t, c.cfg.NodeDir)
	}
	var si unix.Sysinfo_t
	if maxPID, err := os.ReadFile(filepath.Join(c.cfg.ProcDir, "sys", "kernel", "pid_max")); err == nil && unix.Sysinfo(&si) == nil {
		if m, err := strconv.ParseInt(strings.TrimSpace(string(maxPID)), 10, 64); err == nil {
			n.Rlimit = &RlimitStats{Time: t, MaxPID: &m, NumOfRunningProcesses: ptr(int64(si.Procs))}
		}
	}
	return n
}

// bootTime is the node's start: btime in /proc/stat.
func (c *Collector) bootTime() time.Time {
	b, _ := os.ReadFile(filepath.Join(c.cfg.ProcDir, "stat"))
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			if s, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
				return time.Unix(s, 0)
			}
		}
	}
	return time.Time{}
}

func (c *Collector) podStats(ctx context.Context, at time.Time, ps PodSample, rate *uint64, rates []*uint64) PodStats {
	t := metav1.NewTime(at)
	p := ps.Pod
	out := PodStats{PodRef: PodReference{Name: p.Name, Namespace: p.Namespace, UID: p.UID},
		StartTime: metav1.NewTime(p.StartTime), Containers: []ContainerStats{}}
	if u := ps.Usage; u != nil {
		out.CPU, out.Memory, out.IO, out.Swap = cpuStats(t, *u, rate), memoryStats(t, *u), ioStats(t, *u), swapStats(t, *u)
	}
	var ephemeral uint64
	var inodes uint64
	for i, cs := range ps.Containers {
		ct := ContainerStats{Name: cs.Container.Name, StartTime: metav1.NewTime(cs.Container.StartTime),
			CPU: cpuStats(t, cs.Usage, rates[i]), Memory: memoryStats(t, cs.Usage), IO: ioStats(t, cs.Usage), Swap: swapStats(t, cs.Usage)}
		if p.LogDir != "" {
			ct.Logs = c.dirStats(t, filepath.Join(p.LogDir, cs.Container.Name))
			ephemeral += *ct.Logs.UsedBytes
			inodes += *ct.Logs.InodesUsed
		}
		if ct.Rootfs = c.rootfs(ctx, t, cs.Container.ID); ct.Rootfs != nil {
			// The kubelet's pod ephemeral storage: each container's
			// rootfs, its logs and the pod's disk-backed volumes.
			ephemeral += *ct.Rootfs.UsedBytes
			inodes += *ct.Rootfs.InodesUsed
		}
		out.Containers = append(out.Containers, ct)
	}
	if len(ps.Network) > 0 {
		out.Network = networkStats(t, ps.Network)
	}
	for _, v := range p.Volumes {
		vs := VolumeStats{Name: v.Name, FsStats: *c.dirStats(t, v.Path)}
		out.VolumeStats = append(out.VolumeStats, vs)
		if !onTmpfs(v.Path) { // medium Memory counts as memory, not storage
			ephemeral += *vs.UsedBytes
			inodes += *vs.InodesUsed
		}
	}
	if c.cfg.NodeDir != "" {
		fs := statfs(t, c.cfg.NodeDir)
		out.EphemeralStorage = &FsStats{Time: t, AvailableBytes: fs.AvailableBytes, CapacityBytes: fs.CapacityBytes,
			UsedBytes: &ephemeral, InodesUsed: &inodes, InodesFree: fs.InodesFree, Inodes: fs.Inodes}
	}
	return out
}

// rootfs is a container's writable layer as the kubelet's CRI stats
// provider reports it: used bytes and inodes from the runtime, capacity and
// free space of the filesystem it is on.
func (c *Collector) rootfs(ctx context.Context, t metav1.Time, id string) *FsStats {
	if c.cfg.WritableLayer == nil {
		return nil
	}
	used, inodes, dir, err := c.cfg.WritableLayer(ctx, id)
	if err != nil {
		return nil // removed since the pods were listed
	}
	out := &FsStats{Time: t, UsedBytes: &used, InodesUsed: &inodes}
	if dir != "" {
		fs := statfs(t, dir)
		out.AvailableBytes, out.CapacityBytes, out.InodesFree, out.Inodes = fs.AvailableBytes, fs.CapacityBytes, fs.InodesFree, fs.Inodes
	}
	return out
}

func cpuStats(t metav1.Time, u cgroups.Usage, rate *uint64) *CPUStats {
	return &CPUStats{Time: t, UsageNanoCores: rate, UsageCoreNanoSeconds: ptr(u.CPU), PSI: psiStats(u.CPUPressure)}
}

func memoryStats(t metav1.Time, u cgroups.Usage) *MemoryStats {
	m := &MemoryStats{Time: t, UsageBytes: ptr(u.Memory), WorkingSetBytes: ptr(u.WorkingSet), RSSBytes: ptr(u.RSS),
		PageFaults: ptr(u.PageFaults), MajorPageFaults: ptr(u.MajorPageFaults), PSI: psiStats(u.MemoryPressure)}
	if u.MemoryLimit > 0 { // the kubelet: limit less working set, when there is a limit
		m.AvailableBytes = ptr(u.MemoryLimit - min(u.WorkingSet, u.MemoryLimit))
	}
	return m
}

func ioStats(t metav1.Time, u cgroups.Usage) *IOStats {
	if u.IOPressure == nil {
		return nil
	}
	return &IOStats{Time: t, PSI: psiStats(u.IOPressure)}
}

func swapStats(t metav1.Time, u cgroups.Usage) *SwapStats {
	return &SwapStats{Time: t, SwapUsageBytes: ptr(u.Swap)}
}

func psiStats(p *cgroups.Pressure) *PSIStats {
	if p == nil {
		return nil
	}
	line := func(l cgroups.PressureLine) PSIData {
		return PSIData{Total: l.Total, Avg10: l.Avg10, Avg60: l.Avg60, Avg300: l.Avg300}
	}
	return &PSIStats{Some: line(p.Some), Full: line(p.Full)}
}

// Interface is one line of /proc/<pid>/net/dev.
type Interface struct {
	Name                                    string
	RxBytes, RxPackets, RxErrors, RxDropped uint64
	TxBytes, TxPackets, TxErrors, TxDropped uint64
}

func networkStats(t metav1.Time, ifs []Interface) *NetworkStats {
	n := &NetworkStats{Time: t}
	for _, i := range ifs {
		s := InterfaceStats{Name: i.Name, RxBytes: ptr(i.RxBytes), RxErrors: ptr(i.RxErrors), TxBytes: ptr(i.TxBytes), TxErrors: ptr(i.TxErrors)}
		if i.Name == defaultInterface {
			n.InterfaceStats = s
		}
		n.Interfaces = append(n.Interfaces, s)
	}
	return n
}

// podNetwork reads the interfaces of the pod's network namespace through
// a process of one of its containers, as cAdvisor does (noderun pins the
// namespace without a process of its own in it): a hostNetwork pod's are
// the host's.
func (c *Collector) podNetwork(ps PodSample) []Interface {
	for _, cs := range ps.Containers {
		pids, err := c.cfg.Cgroups.Procs(cs.Container.Cgroup)
		if err != nil || len(pids) == 0 {
			continue
		}
		ifs, err := readNetDev(filepath.Join(c.cfg.ProcDir, strconv.Itoa(pids[0]), "net", "dev"))
		if err == nil {
			return ifs
		}
	}
	return nil
}

// readNetDev parses a net/dev file, without the loopback (as cAdvisor).
func readNetDev(path string) ([]Interface, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Interface
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		name = strings.TrimSpace(name)
		f := strings.Fields(rest)
		if !ok || len(f) < 16 || name == "lo" {
			continue // the two header lines
		}
		var v [16]uint64
		for i := range v {
			v[i], _ = strconv.ParseUint(f[i], 10, 64)
		}
		out = append(out, Interface{Name: name, RxBytes: v[0], RxPackets: v[1], RxErrors: v[2], RxDropped: v[3],
			TxBytes: v[8], TxPackets: v[9], TxErrors: v[10], TxDropped: v[11]})
	}
	return out, sc.Err()
}

// statfs is a filesystem's capacity and use, as the kubelet reports it.
func statfs(t metav1.Time, path string) *FsStats {
	var st unix.Statfs_t
	if unix.Statfs(path, &st) != nil {
		return &FsStats{Time: t}
	}
	bs := uint64(st.Bsize)
	return &FsStats{Time: t, CapacityBytes: ptr(st.Blocks * bs), AvailableBytes: ptr(st.Bavail * bs),
		UsedBytes: ptr((st.Blocks - st.Bfree) * bs), Inodes: ptr(st.Files), InodesFree: ptr(st.Ffree),
		InodesUsed: ptr(st.Files - st.Ffree)}
}

// dirStats is a directory's use (its blocks and inodes, as du counts
// them, without crossing into another filesystem) on its filesystem.
func (c *Collector) dirStats(t metav1.Time, dir string) *FsStats {
	fsStats := statfs(t, dir)
	var used, inodes uint64
	var dev uint64
	first := true
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // gone while walked, or unreadable: not counted
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok {
			return nil
		}
		if first {
			dev, first = st.Dev, false
		} else if st.Dev != dev {
			return fs.SkipDir
		}
		used += uint64(st.Blocks) * 512
		inodes++
		return nil
	})
	fsStats.UsedBytes, fsStats.InodesUsed = &used, &inodes
	return fsStats
}

// onTmpfs reports whether path is on a tmpfs (an emptyDir of medium Memory).
func onTmpfs(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.TMPFS_MAGIC
}
