package cgroups

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	"github.com/godbus/dbus/v5"
)

// Tier is a QoS class's cgroup below the root, as the kubelet's kubepods:
// Burstable and BestEffort pods each have a parent of their class,
// Guaranteed pods sit at the top.
type Tier string

const (
	Guaranteed Tier = ""
	Burstable  Tier = "burstable"
	BestEffort Tier = "besteffort"
)

// MinShares is the kernel's least cpu.shares, which the kubelet gives
// BestEffort (its MinShares).
const MinShares = 2

// PodResources are a pod cgroup's limits, the kubelet's ResourceConfig for
// the pod: zero quota or memory is no limit.
type PodResources struct {
	CPUShares uint64
	CPUQuota  int64  // µs per CPUPeriod; 0: none
	CPUPeriod uint64 // µs, with CPUQuota
	Memory    int64  // bytes; 0: none
}

// tierPath is the cgroupfs path or slice name of a tier.
func (l Layout) tierPath(t Tier) string {
	switch {
	case l.Driver == Systemd && t == Guaranteed:
		return l.root() + ".slice"
	case l.Driver == Systemd:
		return l.root() + "-" + string(t) + ".slice"
	case t == Guaranteed:
		return "/" + l.root()
	}
	return "/" + l.root() + "/" + string(t)
}

// EnsurePod makes the pod's cgroup at parent (PodParent) with its limits,
// or sets them again on the one a pod adopted after a restart has: the
// same values, since a pod's resources never change under its UID.
func (l Layout) EnsurePod(ctx context.Context, parent string, r PodResources) error {
	err := l.ensure(ctx, parent, r)
	if err == nil {
		err = l.noHugePages(parent)
	}
	if err != nil {
		return fmt.Errorf("pod cgroup %s: %w", parent, err)
	}
	return nil
}

// noHugePages limits every huge page size to 0 in a pod's cgroup, as the
// kubelet does for the sizes a pod does not request (and no Pod may
// request them here), where the hugetlb controller is: its v1 hierarchy,
// or enabled for the pod's v2 cgroup. The QoS parents stay unlimited.
func (l Layout) noHugePages(path string) error {
	sizes := hugePageSizes()
	if len(sizes) == 0 {
		return nil
	}
	dir, suffix := l.Dir(path, "hugetlb"), ".limit_in_bytes"
	if l.Unified {
		suffix = ".max"
		if b, err := os.ReadFile(filepath.Join(filepath.Dir(dir), "cgroup.subtree_control")); err != nil || !slices.Contains(strings.Fields(string(b)), "hugetlb") {
			return nil
		}
	} else if _, err := os.Stat(filepath.Join(l.fs(), "hugetlb")); err != nil {
		return nil
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, size := range sizes {
		if err := writeFile(filepath.Join(dir, "hugetlb."+size+suffix), "0"); err != nil {
			return err
		}
	}
	return nil
}

// hugePagesDir lists the kernel's huge page pools; tests fake it.
var hugePagesDir = "/sys/kernel/mm/hugepages"

// hugePageSizes names the host's huge page sizes as hugetlb's files do:
// hugepages-2048kB is 2MB, hugepages-1048576kB 1GB.
func hugePageSizes() []string {
	ents, _ := os.ReadDir(hugePagesDir)
	var out []string
	for _, e := range ents {
		kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(e.Name(), "hugepages-"), "kB"), 10, 64)
		if err != nil {
			continue
		}
		size, unit := kb, "KB"
		for _, u := range []string{"MB", "GB", "TB"} {
			if size < 1024 || size%1024 != 0 {
				break
			}
			size, unit = size/1024, u
		}
		out = append(out, strconv.FormatUint(size, 10)+unit)
	}
	return out
}

// UpdateQoS makes the QoS parents and sets their cpu.shares as the
// kubelet's QoS container manager does on each pod sync: BestEffort's
// MinShares, Burstable's from the sum of its pods' cpu requests. No
// memory is reserved (the kubelet's --qos-reserved is alpha and off).
func (l Layout) UpdateQoS(ctx context.Context, burstableShares uint64) error {
	for _, s := range []struct {
		t      Tier
		shares uint64
	}{{BestEffort, MinShares}, {Burstable, burstableShares}} {
		if err := l.ensure(ctx, l.tierPath(s.t), PodResources{CPUShares: s.shares}); err != nil {
			return fmt.Errorf("QoS cgroup %s: %w", l.tierPath(s.t), err)
		}
	}
	return nil
}

func (l Layout) ensure(ctx context.Context, path string, r PodResources) error {
	switch {
	case l.Driver == Systemd:
		return l.setSlice(ctx, path, sliceProperties(r, l.Unified))
	case l.Unified:
		return l.ensureV2(path, r)
	}
	return l.ensureV1(path, r)
}

// ensureV1 writes the cpu and memory hierarchies' files; runc makes the
// pod's dirs in the other hierarchies with its containers'.
func (l Layout) ensureV1(path string, r PodResources) error {
	files := [][3]string{{"cpu", "cpu.shares", u64(r.CPUShares)}}
	if r.CPUQuota > 0 {
		files = append(files, [3]string{"cpu", "cpu.cfs_period_us", u64(r.CPUPeriod)},
			[3]string{"cpu", "cpu.cfs_quota_us", strconv.FormatInt(r.CPUQuota, 10)})
	}
	if r.Memory > 0 {
		files = append(files, [3]string{"memory", "memory.limit_in_bytes", strconv.FormatInt(r.Memory, 10)})
	}
	for _, f := range files {
		dir := l.Dir(path, f[0])
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := writeFile(filepath.Join(dir, f[1]), f[2]); err != nil {
			return err
		}
	}
	return nil
}

// ensureV2 makes the dir with cpu, memory, pids and hugetlb enabled in every
// ancestor below the mount (as runc does for its containers' paths), then
// writes the v2 values: shares as cpu.weight by the kubelet's conversion.
func (l Layout) ensureV2(path string, r PodResources) error {
	dir := l.fs()
	for _, part := range strings.Split(strings.Trim(path, "/"), "/") {
		if err := enableControllers(dir); err != nil {
			return err
		}
		dir = filepath.Join(dir, part)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
	}
	files := [][2]string{{"cpu.weight", u64(SharesToWeight(r.CPUShares))}}
	if r.CPUQuota > 0 {
		files = append(files, [2]string{"cpu.max", strconv.FormatInt(r.CPUQuota, 10) + " " + u64(r.CPUPeriod)})
	}
	if r.Memory > 0 {
		files = append(files, [2]string{"memory.max", strconv.FormatInt(r.Memory, 10)})
	}
	for _, f := range files {
		if err := writeFile(filepath.Join(dir, f[0]), f[1]); err != nil {
			return err
		}
	}
	return nil
}

// enableControllers enables in dir's children those of cpu, memory, pids
// and hugetlb that dir has. Every v2 cgroup has cgroup.controllers; a dir without
// one has no controller to enable.
func enableControllers(dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var enable []string
	for _, c := range strings.Fields(string(b)) {
		if c == "cpu" || c == "memory" || c == "pids" || c == "hugetlb" {
			enable = append(enable, "+"+c)
		}
	}
	if len(enable) == 0 {
		return nil
	}
	return writeFile(filepath.Join(dir, "cgroup.subtree_control"), strings.Join(enable, " "))
}

// SharesToWeight converts cpu.shares to cgroup v2's cpu.weight as the
// kubelet's cgroup v2 manager does: [2, 262144] onto [1, 10000].
func SharesToWeight(shares uint64) uint64 {
	shares = min(max(shares, MinShares), 262144)
	return 1 + (shares-2)*9999/262142
}

// sliceProperties are the unit properties of a slice with r, named as
// runc's systemd driver sets them for v1 and v2; CPUQuotaPerSecUSec is
// rounded up to whole 10 ms, as runc does, since systemd keeps a percent.
// The period is systemd's default, the kubelet's 100 ms: no
// CPUQuotaPeriodUSec, which systemd before 242 refuses.
func sliceProperties(r PodResources, unified bool) []sddbus.Property {
	props := []sddbus.Property{
		{Name: "CPUAccounting", Value: dbus.MakeVariant(true)},
		{Name: "MemoryAccounting", Value: dbus.MakeVariant(true)},
	}
	if unified {
		props = append(props, sddbus.Property{Name: "CPUWeight", Value: dbus.MakeVariant(SharesToWeight(r.CPUShares))})
	} else {
		props = append(props, sddbus.Property{Name: "CPUShares", Value: dbus.MakeVariant(r.CPUShares)})
	}
	if r.CPUQuota > 0 && r.CPUPeriod > 0 {
		perSec := uint64(r.CPUQuota) * 1000000 / r.CPUPeriod
		if perSec%10000 != 0 {
			perSec = (perSec/10000 + 1) * 10000
		}
		props = append(props, sddbus.Property{Name: "CPUQuotaPerSecUSec", Value: dbus.MakeVariant(perSec)})
	}
	if r.Memory > 0 {
		name := "MemoryLimit"
		if unified {
			name = "MemoryMax"
		}
		props = append(props, sddbus.Property{Name: name, Value: dbus.MakeVariant(uint64(r.Memory))})
	}
	return props
}

func (l Layout) setSlice(ctx context.Context, name string, props []sddbus.Property) error {
	set := l.SetSlice
	if set == nil {
		set = setSystemdSlice
	}
	return set(ctx, name, props)
}

// SwapControl reports whether containers' swap can be limited, as the
// kubelet finds out: memory.memsw.limit_in_bytes in the v1 memory
// hierarchy's root (swapaccount), memory.swap.max in this process's own
// v2 cgroup (the root has none).
func (l Layout) SwapControl() bool {
	p := filepath.Join(l.fs(), "memory", "memory.memsw.limit_in_bytes")
	if l.Unified {
		p = filepath.Join(l.fs(), ownCgroup(), "memory.swap.max")
	}
	_, err := os.Stat(p)
	return err == nil
}

// ownCgroup is this process's v2 cgroup ("0::/path" in /proc/self/cgroup).
func ownCgroup() string {
	b, _ := os.ReadFile("/proc/self/cgroup")
	for _, line := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			return p
		}
	}
	return "/"
}

// removeTiers removes the QoS parents once no pod is left in them.
func (l Layout) removeTiers(ctx context.Context) error {
	var errs []error
	for _, t := range []Tier{Burstable, BestEffort} {
		if l.Driver == Systemd {
			errs = append(errs, l.stopEmptySlice(ctx, l.tierPath(t)))
			continue
		}
		errs = append(errs, l.rmdirAll(l.tierPath(t), true))
	}
	return errors.Join(errs...)
}

func u64(v uint64) string { return strconv.FormatUint(v, 10) }

// writeFile writes a cgroup file. On a cgroup fs O_CREAT makes nothing (a
// missing file is a controller the hierarchy lacks, and fails); on the
// plain dirs unit tests fake it with, it makes the file.
func writeFile(path, value string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s to %s: %w", value, path, err)
	}
	return nil
}

// SwapCapacity is the machine's swap in bytes (SwapTotal in /proc/meminfo),
// as the kubelet's machine info; 0 when it cannot be read.
func SwapCapacity() int64 {
	mi, err := readMeminfo("/proc/meminfo")
	if err != nil {
		return 0
	}
	return int64(mi["SwapTotal"])
}
