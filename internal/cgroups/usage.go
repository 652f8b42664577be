package cgroups

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Usage is what a cgroup has used, as cAdvisor reads it for the kubelet.
type Usage struct {
	// CPU time in nanoseconds, cumulative.
	CPU, CPUUser, CPUSystem uint64
	// Memory in bytes. WorkingSet is the kubelet's: usage less the
	// inactive file cache (what the kernel reclaims first), floored at 0.
	Memory, WorkingSet, RSS, Cache, Swap uint64
	// MemoryLimit is the cgroup's limit; 0 when it has none.
	MemoryLimit                 uint64
	PageFaults, MajorPageFaults uint64
	// Pressure stall information, on cgroup v2 only (nil otherwise).
	CPUPressure, MemoryPressure, IOPressure *Pressure
}

// Pressure is a PSI file (cpu.pressure, memory.pressure, io.pressure).
type Pressure struct{ Some, Full PressureLine }

// PressureLine is one line of a PSI file: the averages are percentages
// of time stalled over 10 s, 60 s and 300 s; Total is in microseconds.
type PressureLine struct {
	Avg10, Avg60, Avg300 float64
	Total                uint64
}

// userHZ is the unit of cpuacct.stat (USER_HZ, 100 on every Linux ABI).
const userHZ = 100

// Usage reads a cgroupsPath's usage on this layout's hierarchy. A cgroup
// that is gone is an error that wraps os.ErrNotExist.
func (l Layout) Usage(cgroupsPath string) (Usage, error) {
	if l.Unified {
		return usageV2(l.Dir(cgroupsPath, ""))
	}
	return usageV1(l.Dir(cgroupsPath, "cpuacct"), l.Dir(cgroupsPath, "memory"))
}

// CPU reads only a cgroup's cumulative CPU time in nanoseconds: the
// first of the two samples a rate needs.
func (l Layout) CPU(cgroupsPath string) (uint64, error) {
	if l.Unified {
		kv, err := readKeyValues(filepath.Join(l.Dir(cgroupsPath, ""), "cpu.stat"))
		return kv["usage_usec"] * 1000, err
	}
	return readUint(filepath.Join(l.Dir(cgroupsPath, "cpuacct"), "cpuacct.usage"))
}

func usageV1(cpuDir, memDir string) (Usage, error) {
	var u Usage
	var err error
	if u.CPU, err = readUint(filepath.Join(cpuDir, "cpuacct.usage")); err != nil {
		return u, err
	}
	stat, err := readKeyValues(filepath.Join(cpuDir, "cpuacct.stat"))
	if err != nil {
		return u, err
	}
	u.CPUUser, u.CPUSystem = stat["user"]*1e9/userHZ, stat["system"]*1e9/userHZ
	if u.Memory, err = readUint(filepath.Join(memDir, "memory.usage_in_bytes")); err != nil {
		return u, err
	}
	mem, err := readKeyValues(filepath.Join(memDir, "memory.stat"))
	if err != nil {
		return u, err
	}
	u.WorkingSet = workingSet(u.Memory, mem["total_inactive_file"])
	u.RSS, u.Cache, u.Swap = mem["total_rss"], mem["total_cache"], mem["total_swap"]
	u.PageFaults, u.MajorPageFaults = mem["total_pgfault"], mem["total_pgmajfault"]
	// v1's "no limit" is the largest page-aligned int64.
	if limit, err := readUint(filepath.Join(memDir, "memory.limit_in_bytes")); err == nil && limit < 1<<62 {
		u.MemoryLimit = limit
	}
	return u, nil
}

func usageV2(dir string) (Usage, error) {
	var u Usage
	cpu, err := readKeyValues(filepath.Join(dir, "cpu.stat"))
	if err != nil {
		return u, err
	}
	u.CPU, u.CPUUser, u.CPUSystem = cpu["usage_usec"]*1000, cpu["user_usec"]*1000, cpu["system_usec"]*1000
	if u.Memory, err = readUint(filepath.Join(dir, "memory.current")); err != nil {
		return u, err
	}
	mem, err := readKeyValues(filepath.Join(dir, "memory.stat"))
	if err != nil {
		return u, err
	}
	u.WorkingSet = workingSet(u.Memory, mem["inactive_file"])
	u.RSS, u.Cache = mem["anon"], mem["file"]
	u.PageFaults, u.MajorPageFaults = mem["pgfault"], mem["pgmajfault"]
	u.Swap, _ = readUint(filepath.Join(dir, "memory.swap.current"))
	u.MemoryLimit, _ = readUint(filepath.Join(dir, "memory.max")) // "max": no limit, 0
	u.CPUPressure, _ = ReadPressure(filepath.Join(dir, "cpu.pressure"))
	u.MemoryPressure, _ = ReadPressure(filepath.Join(dir, "memory.pressure"))
	u.IOPressure, _ = ReadPressure(filepath.Join(dir, "io.pressure"))
	return u, nil
}

// workingSet is the kubelet's (cAdvisor's) working set: usage less the
// inactive file cache, never below zero.
func workingSet(usage, inactiveFile uint64) uint64 {
	if inactiveFile >= usage {
		return 0
	}
	return usage - inactiveFile
}

// ReadPressure reads a PSI file: a cgroup's or /proc/pressure/*.
func ReadPressure(path string) (*Pressure, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	p := &Pressure{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		kind, rest, _ := strings.Cut(line, " ")
		var pl PressureLine
		for _, f := range strings.Fields(rest) {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "avg10":
				pl.Avg10, err = strconv.ParseFloat(v, 64)
			case "avg60":
				pl.Avg60, err = strconv.ParseFloat(v, 64)
			case "avg300":
				pl.Avg300, err = strconv.ParseFloat(v, 64)
			case "total":
				pl.Total, err = strconv.ParseUint(v, 10, 64)
			}
			if err != nil {
				return nil, fmt.Errorf("%s: %q: %w", path, f, err)
			}
		}
		switch kind {
		case "some":
			p.Some = pl
		case "full":
			p.Full = pl
		}
	}
	return p, nil
}

// readUint reads a file holding one number.
func readUint(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 0, nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return n, nil
}

// readKeyValues reads a flat-keyed cgroup file ("key N" a line).
func readKeyValues(path string) (map[string]uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: %q: %w", path, line, err)
		}
		out[k] = n
	}
	return out, nil
}

// Procs lists the processes in a cgroupsPath (its cgroup.procs): the
// first one gives the network namespace a pod's containers share.
func (l Layout) Procs(cgroupsPath string) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(l.Dir(cgroupsPath, "memory"), "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			out = append(out, pid)
		}
	}
	return out, nil
}

// NodeUsage reads the whole node's usage as the kubelet does through
// cAdvisor: the root cgroup's on v1 (MemoryLimit: MemTotal); on v2, whose root cgroup has no
// memory files, CPU from the root's cpu.stat and memory from meminfo
// (MemTotal - MemFree, less Inactive(file)), and PSI from /proc/pressure
// when the kernel has it.
func (l Layout) NodeUsage(procDir string) (Usage, error) {
	var u Usage
	var err error
	if !l.Unified {
		u, err = usageV1(filepath.Join(l.fs(), "cpuacct"), filepath.Join(l.fs(), "memory"))
	} else {
		u, err = nodeUsageV2(l.fs(), procDir)
	}
	if err != nil {
		return u, err
	}
	// The node's limit is its memory, as cAdvisor's machine info has it.
	mi, err := readMeminfo(filepath.Join(procDir, "meminfo"))
	if err != nil {
		return u, err
	}
	u.MemoryLimit = mi["MemTotal"]
	if !l.Unified {
		return u, nil // cAdvisor reads PSI on cgroup v2 only
	}
	u.CPUPressure, _ = ReadPressure(filepath.Join(procDir, "pressure", "cpu"))
	u.MemoryPressure, _ = ReadPressure(filepath.Join(procDir, "pressure", "memory"))
	u.IOPressure, _ = ReadPressure(filepath.Join(procDir, "pressure", "io"))
	return u, nil
}

func nodeUsageV2(fs, procDir string) (Usage, error) {
	var u Usage
	cpu, err := readKeyValues(filepath.Join(fs, "cpu.stat"))
	if err != nil {
		return u, err
	}
	u.CPU, u.CPUUser, u.CPUSystem = cpu["usage_usec"]*1000, cpu["user_usec"]*1000, cpu["system_usec"]*1000
	mi, err := readMeminfo(filepath.Join(procDir, "meminfo"))
	if err != nil {
		return u, err
	}
	total, free := mi["MemTotal"], mi["MemFree"]
	if free > total {
		return u, errors.New("meminfo: MemFree exceeds MemTotal")
	}
	u.Memory = total - free
	u.WorkingSet = workingSet(u.Memory, mi["Inactive(file)"])
	u.RSS, u.Cache = mi["AnonPages"], mi["Cached"]
	return u, nil
}

// readMeminfo reads /proc/meminfo in bytes.
func readMeminfo(path string) (map[string]uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			continue
		}
		if len(f) > 1 && f[1] == "kB" {
			n *= 1024
		}
		out[k] = n
	}
	return out, nil
}
