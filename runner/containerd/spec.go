package containerd

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/internal/cgroups"
	"github.com/noderun/noderun/manifests"

	"github.com/noderun/noderun/runner"
)

// specOpts turns an engine-resolved container config into OCI spec options.
// Each tweak is a small function so it can be tested on an empty spec.
func specOpts(cfg *runner.ContainerConfig, oomFloor int, cg cgroups.Layout) []oci.SpecOpts {
	opts := []oci.SpecOpts{
		oci.WithProcessArgs(cfg.Args...),
		oci.WithEnv(cfg.Env),
		withCwd(cfg.WorkingDir),
		withSandboxNamespaces(cfg.Sandbox),
		withTargetPIDNamespace(cfg.TargetPID),
		withCRIDefaultMounts(cg.Unified && !privileged(cfg.Container)),
		withMounts(cfg.Mounts, readMountinfo),
		withUserNamespace(cfg.Sandbox, cfg.Mounts),
		oci.WithCgroup(cg.ContainerPath(cfg.CgroupParent, cfg.ID)),
		withOOMScoreAdj(cfg.OOMScoreAdj, oomFloor),
		withResources(cfg.Resources, cg.Unified),
		withoutDefaultRlimits,
		withSysctls(cfg.Pod),
	}
	return opts
}

// withCRIDefaultMounts turns containerd's default mounts into the CRI
// plugin's: no tmpfs on /run (the image's /run shows, as under the kubelet)
// and the container's own cgroups at /sys/fs/cgroup, read-only unless
// privileged (oci.WithPrivileged makes it writable), which programs read to
// size themselves (a JVM's heap, GOMAXPROCS). With ownCgroupNS (cgroup v2,
// not privileged) the container also gets a cgroup namespace, so that
// /sys/fs/cgroup and /proc/self/cgroup show its cgroup as the root; CRI
// leaves v1 and privileged containers in the host's, as this does. A volume
// mounted at /sys/fs/cgroup replaces the mount (withMounts comes after).
func withCRIDefaultMounts(ownCgroupNS bool) oci.SpecOpts {
	return func(ctx context.Context, cl oci.Client, c *containers.Container, s *oci.Spec) error {
		if err := oci.WithoutRunMount(ctx, cl, c, s); err != nil {
			return err
		}
		s.Mounts = append(s.Mounts, specs.Mount{
			Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup",
			Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"},
		})
		if ownCgroupNS {
			return oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.CgroupNamespace})(ctx, cl, c, s)
		}
		return nil
	}
}

func privileged(c *v1.Container) bool {
	sc := c.SecurityContext
	return sc != nil && sc.Privileged != nil && *sc.Privileged
}

// withSysctls sets the pod's sysctls in every container: runc writes them
// in the container's namespaces, which are the pod's (the runner has
// checked they are namespaced and allowed).
func withSysctls(pod *v1.Pod) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		sc := pod.Spec.SecurityContext
		if sc == nil || len(sc.Sysctls) == 0 {
			return nil
		}
		if s.Linux.Sysctl == nil {
			s.Linux.Sysctl = map[string]string{}
		}
		for _, x := range sc.Sysctls {
			s.Linux.Sysctl[manifests.SysctlName(x.Name)] = x.Value
		}
		return nil
	}
}

// withoutDefaultRlimits drops containerd's default RLIMIT_NOFILE of 1024, as
// the CRI plugin does, so containers inherit the limits of containerd's
// shim like under the kubelet; nothing is ever raised above them.
func withoutDefaultRlimits(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
	if s.Process != nil {
		s.Process.Rlimits = nil
	}
	return nil
}

func withCwd(dir string) oci.SpecOpts {
	if dir == "" {
		dir = "/"
	}
	return oci.WithProcessCwd(dir)
}

// withSandboxNamespaces joins the pod's pinned namespaces; hostNetwork,
// hostPID and hostIPC pods share the host's instead, as in Kubernetes.
// Without hostPID or shareProcessNamespace every container has its own PID
// namespace, as under CRI.
func withSandboxNamespaces(sb *runner.Sandbox) oci.SpecOpts {
	return func(ctx context.Context, cl oci.Client, c *containers.Container, s *oci.Spec) error {
		var join []specs.LinuxNamespace
		var host []specs.LinuxNamespaceType
		if sb.HostNetwork {
			host = append(host, specs.NetworkNamespace, specs.UTSNamespace)
		} else {
			join = append(join,
				specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: sb.NetNSPath()},
				specs.LinuxNamespace{Type: specs.UTSNamespace, Path: sb.UTSNSPath()})
		}
		if sb.HostIPC {
			host = append(host, specs.IPCNamespace)
		} else {
			join = append(join, specs.LinuxNamespace{Type: specs.IPCNamespace, Path: sb.IPCNSPath()})
		}
		switch {
		case sb.HostPID:
			host = append(host, specs.PIDNamespace)
		case sb.SharePID:
			join = append(join, specs.LinuxNamespace{Type: specs.PIDNamespace, Path: sb.PIDNSPath()})
		}
		for _, ns := range join {
			if err := oci.WithLinuxNamespace(ns)(ctx, cl, c, s); err != nil {
				return err
			}
		}
		for _, t := range host {
			if err := oci.WithHostNamespace(t)(ctx, cl, c, s); err != nil {
				return err
			}
		}
		return nil
	}
}

// withTargetPIDNamespace puts an ephemeral container in the PID namespace
// of its target's process, as containerd's CRI plugin does for the
// kubelet's NamespaceMode_TARGET: through /proc/<pid>/ns/pid.
func withTargetPIDNamespace(pid uint32) oci.SpecOpts {
	return func(ctx context.Context, cl oci.Client, c *containers.Container, s *oci.Spec) error {
		if pid == 0 {
			return nil
		}
		return oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.PIDNamespace, Path: fmt.Sprintf("/proc/%d/ns/pid", pid)})(ctx, cl, c, s)
	}
}

// withMounts bind-mounts volumes and the pod's generated files, replacing any
// default mount at the same destination. mountPropagation maps as in CRI:
// None is rprivate, HostToContainer rslave, Bidirectional rshared, and the
// root's propagation follows so that runc can set those up.
func withMounts(mounts []runner.Mount, mountinfo func() []mountInfo) oci.SpecOpts {
	return func(ctx context.Context, cl oci.Client, c *containers.Container, s *oci.Spec) error {
		dests := make([]string, 0, len(mounts))
		add := make([]specs.Mount, 0, len(mounts))
		var infos []mountInfo
		for _, m := range mounts {
			prop := "rprivate"
			switch m.Propagation {
			case v1.MountPropagationHostToContainer, v1.MountPropagationBidirectional:
				if infos == nil {
					infos = mountinfo()
				}
				var err error
				if prop, err = propagationFor(m, infos); err != nil {
					return err
				}
				if s.Linux.RootfsPropagation != "rshared" {
					s.Linux.RootfsPropagation = prop
				}
			}
			opts := []string{"rbind", prop}
			if m.ReadOnly {
				opts = append(opts, "ro")
				if m.RecursiveReadOnly {
					opts = append(opts, "rro") // runc's, as containerd's CRI asks
				}
			} else {
				opts = append(opts, "rw")
			}
			dests = append(dests, m.Destination)
			add = append(add, specs.Mount{Source: m.Source, Destination: m.Destination, Type: "bind", Options: opts})
		}
		if err := oci.WithoutMounts(dests...)(ctx, cl, c, s); err != nil {
			return err
		}
		return oci.WithMounts(add)(ctx, cl, c, s)
	}
}

// propagationFor checks, as CRI's ensureShared and ensureSharedOrSlave do,
// that the mount holding m's source propagates at all: a private source
// would silently propagate nothing.
func propagationFor(m runner.Mount, infos []mountInfo) (string, error) {
	mi := mountOf(m.Source, infos)
	if m.Propagation == v1.MountPropagationBidirectional {
		if !mi.shared {
			return "", fmt.Errorf("%w: mountPropagation Bidirectional of %s: %s is mounted on %s, which is not a shared mount", runner.ErrContainerConfig, m.Destination, m.Source, mi.point)
		}
		return "rshared", nil
	}
	if !mi.shared && !mi.slave {
		return "", fmt.Errorf("%w: mountPropagation HostToContainer of %s: %s is mounted on %s, which is neither a shared nor a slave mount", runner.ErrContainerConfig, m.Destination, m.Source, mi.point)
	}
	return "rslave", nil
}

// mountInfo is what propagation needs of one line of mountinfo.
type mountInfo struct {
	point         string
	shared, slave bool
}

// readMountinfo parses /proc/self/mountinfo.
func readMountinfo() []mountInfo {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []mountInfo
	for _, line := range strings.Split(string(b), "\n") {
		pre, _, ok := strings.Cut(line, " - ")
		f := strings.Fields(pre)
		if !ok || len(f) < 6 {
			continue
		}
		mi := mountInfo{point: f[4]}
		for _, opt := range f[6:] {
			mi.shared = mi.shared || strings.HasPrefix(opt, "shared:")
			mi.slave = mi.slave || strings.HasPrefix(opt, "master:")
		}
		out = append(out, mi)
	}
	return out
}

// mountOf is the mount whose point is the longest prefix of path (the last
// one mounted there wins, as in the kernel).
func mountOf(path string, infos []mountInfo) mountInfo {
	best := mountInfo{point: "/"}
	for _, mi := range infos {
		if (path == mi.point || strings.HasPrefix(path, strings.TrimSuffix(mi.point, "/")+"/")) && len(mi.point) >= len(best.point) {
			best = mi
		}
	}
	return best
}

// withOOMScoreAdj sets the process's oom_score_adj, at least floor (see
// OOMScoreFloor): runc fails a container whose score it may not set.
func withOOMScoreAdj(want, floor int) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		want = max(want, floor)
		if s.Process == nil {
			s.Process = &specs.Process{}
		}
		s.Process.OOMScoreAdj = &want
		return nil
	}
}

// capSysResource is CAP_SYS_RESOURCE's bit in /proc/<pid>/status's CapEff.
const capSysResource = 24

// OOMScoreFloor is the lowest oom_score_adj this process can give a
// container: any (-1000) with CAP_SYS_RESOURCE, which lowering a score
// below the process's own takes; without it (a container host, a user
// namespace) its own score, as containerd's restrict_oom_score_adj does.
func OOMScoreFloor() int {
	status, _ := os.ReadFile("/proc/self/status")
	return oomScoreFloor(string(status), ownOOMScoreAdj())
}

func oomScoreFloor(status string, own int) int {
	for line := range strings.Lines(status) {
		if hex, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
			if err == nil && caps&(1<<capSysResource) != 0 {
				return -1000
			}
		}
	}
	return own
}

// ownOOMScoreAdj reads the calling process's oom_score_adj.
func ownOOMScoreAdj() int {
	b, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		return 0
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0
	}
	return v
}

// withResources applies the cgroup settings the runner computed, in the
// spec's v1 terms on every host: runc (cgroupfs or systemd driver) turns
// them into v2's as containerd and the kubelet rely on: shares into
// cpu.weight (1 + (shares-2)*9999/262142), quota and period into cpu.max,
// the limit into memory.max. NoSwap is the kubelet's: memory+swap equal to
// the memory limit on v1 (containerd's CRI plugin sets the spec's swap
// so), memory.swap.max 0 on v2, through the spec's unified map; LimitedSwap
// (v2 only) sets memory.swap.max to the container's share.
func withResources(r runner.Resources, unified bool) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Linux == nil {
			s.Linux = &specs.Linux{}
		}
		if s.Linux.Resources == nil {
			s.Linux.Resources = &specs.LinuxResources{}
		}
		res := s.Linux.Resources
		if r.MemoryLimit > 0 {
			limit := r.MemoryLimit
			res.Memory = &specs.LinuxMemory{Limit: &limit}
			if r.NoSwap && !unified {
				res.Memory.Swap = &limit
			}
		}
		if (r.NoSwap || r.LimitedSwap) && unified {
			if res.Unified == nil {
				res.Unified = map[string]string{}
			}
			res.Unified["memory.swap.max"] = strconv.FormatInt(r.SwapMax, 10) // 0 with NoSwap
		}
		shares := r.CPUShares
		res.CPU = &specs.LinuxCPU{Shares: &shares}
		if r.CPUQuota > 0 {
			period, quota := r.CPUPeriod, r.CPUQuota
			res.CPU.Period, res.CPU.Quota = &period, &quota
		}
		return nil
	}
}

// userOpts sets the process user as containerd's CRI plugin does: the user
// (and runAsGroup) through the image's /etc/passwd and /etc/group, then,
// unless the policy is Strict, the groups that list the user in /etc/group,
// then fsGroup and supplementalGroups, merged and sorted.
func userOpts(u runner.ProcessUser) []oci.SpecOpts {
	user := u.User
	if u.Group != nil {
		user += ":" + strconv.FormatInt(*u.Group, 10)
	}
	opts := []oci.SpecOpts{oci.WithUser(user)}
	if !u.Strict {
		opts = append(opts, withImageGroups(u.User))
	}
	return append(opts, withSupplementalGroups(u.Groups))
}

// withImageGroups adds the groups of user from the image's /etc/group to
// those already set (oci.WithAdditionalGIDs alone would replace them).
func withImageGroups(user string) oci.SpecOpts {
	return func(ctx context.Context, cl oci.Client, c *containers.Container, s *oci.Spec) error {
		had := slices.Clone(s.Process.User.AdditionalGids)
		if err := oci.WithAdditionalGIDs(user)(ctx, cl, c, s); err != nil {
			return err
		}
		s.Process.User.AdditionalGids = mergeGIDs(s.Process.User.AdditionalGids, had)
		return nil
	}
}

func withSupplementalGroups(groups []int64) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Process == nil {
			s.Process = &specs.Process{}
		}
		gids := make([]uint32, 0, len(groups))
		for _, g := range groups {
			gids = append(gids, uint32(g))
		}
		s.Process.User.AdditionalGids = mergeGIDs(s.Process.User.AdditionalGids, gids)
		return nil
	}
}

// mergeGIDs is the sorted union, the order CRI gives.
func mergeGIDs(a, b []uint32) []uint32 {
	out := slices.Concat(a, b)
	slices.Sort(out)
	return slices.Compact(out)
}

// userKey says what determines a container's process user: the image and
// every user setting.
func userKey(cfg *runner.ContainerConfig) string {
	u := cfg.User
	return fmt.Sprintf("%s|%s|%v|%v|%t", cfg.Image.ID, u.User, deref(u.Group), u.Groups, u.Strict)
}

func deref(p *int64) any {
	if p == nil {
		return nil
	}
	return *p
}

// withProcessUser sets a user resolved earlier for the same image and settings.
func withProcessUser(u specs.User) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Process == nil {
			s.Process = &specs.Process{}
		}
		u.AdditionalGids = slices.Clone(u.AdditionalGids)
		s.Process.User = u
		return nil
	}
}
