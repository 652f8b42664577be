// Package cgroups says where noderun's pod and container cgroups are, for
// either cgroup driver (the kubelet's cgroupDriver: cgroupfs or systemd) on
// either hierarchy (v1, hybrid included, or the unified v2), reads what
// noderun reads from them, and removes the pods' cgroups.
package cgroups

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	ctrdcgroups "github.com/containerd/cgroups/v3"
	sddbus "github.com/coreos/go-systemd/v22/dbus"
	"golang.org/x/sys/unix"
)

// Driver manages the pods' cgroups, as the kubelet's cgroupDriver.
type Driver string

const (
	// Cgroupfs: runc writes the cgroup tree itself (the kubelet's default).
	Cgroupfs Driver = "cgroupfs"
	// Systemd: runc asks systemd for a scope in a slice per pod, so that
	// systemd alone owns the tree (kubeadm's default since 1.22).
	Systemd Driver = "systemd"
)

// ParseDriver reads --cgroup-driver.
func ParseDriver(s string) (Driver, error) {
	switch d := Driver(s); d {
	case Cgroupfs, Systemd:
		return d, nil
	}
	return "", fmt.Errorf("--cgroup-driver: %q is neither cgroupfs nor systemd", s)
}

// ParseRoot reads --cgroup-root: one cgroup name, without the dashes that
// systemd reads as nesting.
func ParseRoot(s string) (string, error) {
	if s == "" || strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") != "" {
		return "", fmt.Errorf("--cgroup-root: %q is not a cgroup name of letters, digits and _", s)
	}
	return s, nil
}

// Layout places noderun's cgroups. The zero value is the cgroupfs driver
// on this host's hierarchy under /sys/fs/cgroup, rooted at "noderun".
type Layout struct {
	Driver Driver
	// Unified is a cgroup v2 only host; a hybrid one (v1 controllers,
	// an empty v2 tree beside them) is not.
	Unified bool
	FS      string // where the hierarchies are mounted: /sys/fs/cgroup
	Root    string // the parent of every pod: /noderun or noderun.slice
	// StopUnit stops a systemd unit (the systemd driver's pod slices);
	// nil is systemd's own, over D-Bus.
	StopUnit func(ctx context.Context, name string) error
	// SetSlice starts a systemd slice with properties, or sets them on
	// the slice that runs; nil is systemd's own, over D-Bus.
	SetSlice func(ctx context.Context, name string, props []sddbus.Property) error
}

// Detect is the layout for driver on this host.
func Detect(driver Driver) Layout {
	return Layout{Driver: driver, Unified: ctrdcgroups.Mode() == ctrdcgroups.Unified}
}

func (l Layout) fs() string {
	if l.FS == "" {
		return "/sys/fs/cgroup"
	}
	return l.FS
}

func (l Layout) root() string {
	if l.Root == "" {
		return "noderun"
	}
	return l.Root
}

// PodParent is the cgroup parent of a pod's containers, below its QoS
// tier as the kubelet's pod<uid> below kubepods: /noderun/burstable/pod<id>,
// or the slice noderun-burstable-pod<id>.slice (inside
// noderun-burstable.slice inside noderun.slice, as systemd nests slices by
// their dashes; a sandbox ID is hex, without dashes). A Guaranteed pod's is
// /noderun/pod<id>, noderun-pod<id>.slice.
func (l Layout) PodParent(t Tier, sandboxID string) string {
	if l.Driver == Systemd {
		return strings.TrimSuffix(l.tierPath(t), ".slice") + "-pod" + sandboxID + ".slice"
	}
	return l.tierPath(t) + "/pod" + sandboxID
}

// ContainerPath is the OCI spec's cgroupsPath of a container: a path for
// cgroupfs, "slice:prefix:name" for runc's systemd driver (which makes the
// scope <prefix>-<name>.scope in the slice), as containerd's CRI plugin
// writes them.
func (l Layout) ContainerPath(parent, id string) string {
	if l.Driver == Systemd {
		return parent + ":" + l.root() + ":" + id
	}
	return parent + "/" + id
}

// Path is where a cgroupsPath (or a pod parent) is below a hierarchy's
// mount point. It goes by the path's form, not the driver now configured:
// a container made before the driver changed keeps its old path. cgroupfs
// paths are absolute, systemd's slice names never are.
func (l Layout) Path(cgroupsPath string) string {
	if strings.HasPrefix(cgroupsPath, "/") {
		return cgroupsPath
	}
	slice, rest, scoped := strings.Cut(cgroupsPath, ":")
	p := expandSlice(slice)
	if scoped {
		prefix, name, _ := strings.Cut(rest, ":")
		p += "/" + prefix + "-" + name + ".scope"
	}
	return p
}

// expandSlice is the path systemd gives a slice: a-b.slice is
// /a.slice/a-b.slice.
func expandSlice(slice string) string {
	name := strings.TrimSuffix(slice, ".slice")
	if name == "" || name == "-" {
		return "/"
	}
	var b strings.Builder
	parts := strings.Split(name, "-")
	for i := range parts {
		b.WriteString("/" + strings.Join(parts[:i+1], "-") + ".slice")
	}
	return b.String()
}

// Dir is the directory of a cgroupsPath in the hierarchy of controller
// (memory, cpu, ...); on a unified host every controller shares one.
func (l Layout) Dir(cgroupsPath, controller string) string {
	if l.Unified {
		return filepath.Join(l.fs(), l.Path(cgroupsPath))
	}
	return filepath.Join(l.fs(), controller, l.Path(cgroupsPath))
}

// OOMKills is the kernel's count of OOM kills in a container's cgroup
// (oom_kill in memory.events on v2, memory.oom_control on v1), kept until
// the cgroup is removed; ok is false when it cannot be read.
func (l Layout) OOMKills(cgroupsPath string) (n int, ok bool) {
	file := "memory.oom_control"
	if l.Unified {
		file = "memory.events"
	}
	return readCount(filepath.Join(l.Dir(cgroupsPath, "memory"), file), "oom_kill")
}

// readCount finds "key N" in a cgroup key-value file.
func readCount(path, key string) (int, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == key {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			return n, err == nil
		}
	}
	return 0, false
}

// RemovePod removes a pod's parent cgroup once its containers are gone:
// runc removes a container's own cgroup (or systemd its scope), not the
// parent. With cgroupfs that is a directory in every hierarchy; with
// systemd the pod's slice is stopped, as the kubelet does.
func (l Layout) RemovePod(ctx context.Context, parent string) error {
	if l.Driver == Systemd {
		return l.stopUnit(ctx, parent)
	}
	return l.rmdirAll(parent, false)
}

// RemoveRoot removes the QoS parents, then the parent of all pods, if no
// pod's cgroup is left in them (other noderuns on the host may share them).
func (l Layout) RemoveRoot(ctx context.Context) error {
	if err := l.removeTiers(ctx); err != nil {
		return err
	}
	if l.Driver != Systemd {
		return l.rmdirAll("/"+l.root(), true) // busy: another noderun's pods are in it
	}
	return l.stopEmptySlice(ctx, l.root()+".slice")
}

// stopEmptySlice stops a slice that exists and holds no slice or scope.
func (l Layout) stopEmptySlice(ctx context.Context, slice string) error {
	found := false
	for _, d := range l.hierarchies() {
		ents, err := os.ReadDir(filepath.Join(d, expandSlice(slice)))
		if err != nil {
			continue
		}
		found = true
		for _, e := range ents {
			if e.IsDir() {
				return nil // a pod slice, or a scope, is still there
			}
		}
	}
	if !found {
		return nil // never started, or stopped already
	}
	return l.stopUnit(ctx, slice)
}

func (l Layout) stopUnit(ctx context.Context, name string) error {
	stop := l.StopUnit
	if stop == nil {
		stop = stopSystemdUnit
	}
	if err := stop(ctx, name); err != nil {
		return fmt.Errorf("stop %s: %w", name, err)
	}
	return nil
}

// rmdirAll removes path from every hierarchy that has it. A missing dir
// is no error; a busy one (processes or child cgroups in it) is, unless
// busyOK.
func (l Layout) rmdirAll(path string, busyOK bool) error {
	var errs []error
	for _, d := range l.hierarchies() {
		err := unix.Rmdir(filepath.Join(d, path))
		if err != nil && !errors.Is(err, unix.ENOENT) && !(busyOK && errors.Is(err, unix.EBUSY)) {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", filepath.Join(d, path), err))
		}
	}
	return errors.Join(errs...)
}

// hierarchies lists the mount points of cgroup v1 hierarchies and cgroup2
// below FS.
func (l Layout) hierarchies() []string {
	var out []string
	for _, mp := range cgroupMounts() {
		if mp == l.fs() || strings.HasPrefix(mp, l.fs()+"/") {
			out = append(out, mp)
		}
	}
	return out
}

// cgroupMounts lists every cgroup and cgroup2 mount point; tests fake it.
var cgroupMounts = readCgroupMounts

// readCgroupMounts reads mountinfo once: it grows with every pod (pinned
// namespaces, rootfs).
var readCgroupMounts = sync.OnceValue(func() []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// Fields: id parent maj:min root mountpoint opts ... - fstype source superopts
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		fields, fstype := strings.Fields(pre), strings.Fields(post)
		if len(fields) > 4 && len(fstype) > 0 && (fstype[0] == "cgroup" || fstype[0] == "cgroup2") {
			out = append(out, fields[4])
		}
	}
	return out
})
