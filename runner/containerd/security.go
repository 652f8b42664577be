package containerd

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/contrib/apparmor"
	"github.com/containerd/containerd/contrib/seccomp"
	"github.com/containerd/containerd/oci"
	ctrdapparmor "github.com/containerd/containerd/pkg/apparmor"
	securejoin "github.com/cyphar/filepath-securejoin"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/opencontainers/selinux/go-selinux"
	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/manifests"
	"github.com/noderun/noderun/runner"
)

// The kubelet's default /proc and /sys hiding (pkg/securitycontext), which
// containerd's CRI plugin applies instead of its own defaults.
var (
	defaultMaskedPaths = []string{
		"/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
		"/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap",
	}
	defaultReadonlyPaths = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}
)

// appArmorDefaultProfile is the name containerd's CRI plugin loads its
// default profile under.
const appArmorDefaultProfile = "cri-containerd.apparmor.d"

// hostSecurity is what the node offers for security profiles.
type hostSecurity struct {
	seccompDir string // <state-dir>/seccomp, as the kubelet's <root-dir>/seccomp
	apparmor   bool   // AppArmor enabled and apparmor_parser present
	selinux    bool
}

func detectHostSecurity(seccompDir string) hostSecurity {
	return hostSecurity{seccompDir: seccompDir, apparmor: ctrdapparmor.HostSupports(), selinux: selinux.GetEnabled()}
}

// securityOpts applies the container's securityContext as the kubelet and
// containerd's CRI plugin do, in the plugin's order. Errors wrap
// runner.ErrContainerConfig and name the field at fault.
func (h hostSecurity) securityOpts(cfg *runner.ContainerConfig) ([]oci.SpecOpts, error) {
	sc := cfg.Container.SecurityContext
	if sc == nil {
		sc = &v1.SecurityContext{}
	}
	field := containerField(cfg.Pod, cfg.Container) + ".securityContext"
	priv := privileged(cfg.Container)
	// containerd's default spec sets NoNewPrivileges; CRI turns it off
	// unless allowPrivilegeEscalation is false.
	opts := []oci.SpecOpts{oci.WithNewPrivileges,
		oci.WithMaskedPaths(defaultMaskedPaths), oci.WithReadonlyPaths(defaultReadonlyPaths)}
	opts = append(opts, capabilityOpts(sc.Capabilities)...)
	if priv {
		opts = append(opts, oci.WithPrivileged, oci.WithHostDevices, oci.WithAllDevicesAllowed)
	}
	opts = append(opts, withoutAmbientCaps)
	if sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation {
		opts = append(opts, oci.WithNoNewPrivileges)
	}
	if sc.ProcMount != nil && *sc.ProcMount == v1.UnmaskedProcMount {
		// As the kubelet asks and CRI does: nothing of /proc masked or
		// read-only (validation allows it only with hostUsers: false).
		opts = append(opts, oci.WithMaskedPaths(nil), oci.WithReadonlyPaths(nil))
	}
	if sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem {
		opts = append(opts, oci.WithRootFSReadonly())
	}
	if err := h.checkSELinux(cfg.Pod, sc, field); err != nil {
		return nil, err
	}
	aa, err := h.appArmorOpt(cfg.Pod, cfg.Container, field, priv)
	if err != nil {
		return nil, err
	}
	sec, err := h.seccompOpt(cfg.Pod, sc, field, priv)
	if err != nil {
		return nil, err
	}
	return append(append(opts, aa...), sec...), nil
}

func configError(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", runner.ErrContainerConfig, field, fmt.Sprintf(format, args...))
}

// containerField is the container's path in the manifest, for errors.
func containerField(pod *v1.Pod, c *v1.Container) string {
	for i := range pod.Spec.InitContainers {
		if pod.Spec.InitContainers[i].Name == c.Name {
			return fmt.Sprintf("spec.initContainers[%d]", i)
		}
	}
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == c.Name {
			return fmt.Sprintf("spec.containers[%d]", i)
		}
	}
	return "container " + c.Name
}

// capabilityOpts follows the CRI plugin: add ALL grants every capability
// and drop ALL clears them, before the named ones are added, then dropped.
// Kubernetes' "NET_ADMIN" and the "CAP_NET_ADMIN" spelling both work.
func capabilityOpts(caps *v1.Capabilities) []oci.SpecOpts {
	if caps == nil {
		return nil
	}
	var opts []oci.SpecOpts
	add, addAll := capNames(caps.Add)
	drop, dropAll := capNames(caps.Drop)
	if addAll {
		opts = append(opts, oci.WithAllCurrentCapabilities)
	}
	if dropAll {
		opts = append(opts, oci.WithCapabilities(nil))
	}
	return append(opts, oci.WithAddedCapabilities(add), oci.WithDroppedCapabilities(drop))
}

// capNames returns runc's names for caps and whether ALL is among them.
func capNames(caps []v1.Capability) (names []string, all bool) {
	for _, c := range caps {
		n := strings.ToUpper(string(c))
		if n == "ALL" {
			all = true
			continue
		}
		if !strings.HasPrefix(n, "CAP_") {
			n = "CAP_" + n
		}
		names = append(names, n)
	}
	return names, all
}

// withoutAmbientCaps clears ambient capabilities, as the CRI plugin does.
func withoutAmbientCaps(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
	if s.Process != nil && s.Process.Capabilities != nil {
		s.Process.Capabilities.Ambient = nil
	}
	return nil
}

// checkSELinux: containerd ignores SELinux options on hosts without SELinux,
// as here; noderun does not label, so on an SELinux host it refuses them.
func (h hostSecurity) checkSELinux(pod *v1.Pod, sc *v1.SecurityContext, field string) error {
	if !h.selinux {
		return nil
	}
	if sc.SELinuxOptions != nil {
		return configError(field+".seLinuxOptions", "noderun does not apply SELinux labels")
	}
	if p := pod.Spec.SecurityContext; p != nil && p.SELinuxOptions != nil {
		return configError("spec.securityContext.seLinuxOptions", "noderun does not apply SELinux labels")
	}
	return nil
}

// seccompOpt: the container's profile wins over the pod's; unset is
// Unconfined (the kubelet's seccompDefault is false); privileged containers
// are unconfined whatever they ask. The legacy seccomp annotations have no
// effect, as in Kubernetes since 1.27.
func (h hostSecurity) seccompOpt(pod *v1.Pod, sc *v1.SecurityContext, field string, privileged bool) ([]oci.SpecOpts, error) {
	p, field := sc.SeccompProfile, field+".seccompProfile"
	if p == nil && pod.Spec.SecurityContext != nil {
		p, field = pod.Spec.SecurityContext.SeccompProfile, "spec.securityContext.seccompProfile"
	}
	if p == nil || privileged {
		return nil, nil
	}
	switch p.Type {
	case v1.SeccompProfileTypeUnconfined:
		return nil, nil
	case v1.SeccompProfileTypeRuntimeDefault:
		return []oci.SpecOpts{seccomp.WithDefaultProfile()}, nil
	case v1.SeccompProfileTypeLocalhost:
		prof, err := h.localSeccomp(p.LocalhostProfile)
		if err != nil {
			return nil, configError(field+".localhostProfile", "%v", err)
		}
		return []oci.SpecOpts{withSeccomp(prof)}, nil
	}
	return nil, configError(field+".type", "unsupported value %q", p.Type)
}

// localSeccomp reads an OCI seccomp profile from the seccomp directory; the
// name cannot lead out of it, even through symlinks.
func (h hostSecurity) localSeccomp(name *string) (*specs.LinuxSeccomp, error) {
	if name == nil || *name == "" {
		return nil, fmt.Errorf("required for type Localhost")
	}
	if h.seccompDir == "" {
		return nil, fmt.Errorf("no seccomp profile directory configured")
	}
	path, err := securejoin.SecureJoin(h.seccompDir, *name)
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cannot load seccomp profile %q: %w", path, err)
	}
	var prof specs.LinuxSeccomp
	if err := json.Unmarshal(b, &prof); err != nil {
		return nil, fmt.Errorf("seccomp profile %q: %w", path, err)
	}
	return &prof, nil
}

func withSeccomp(p *specs.LinuxSeccomp) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Linux == nil {
			s.Linux = &specs.Linux{}
		}
		s.Linux.Seccomp = p
		return nil
	}
}

// appArmorOpt: as the kubelet's AppArmor admission, a profile other than
// Unconfined on a host without AppArmor is refused; with AppArmor, unset
// means RuntimeDefault (containerd's own profile), except when privileged.
func (h hostSecurity) appArmorOpt(pod *v1.Pod, c *v1.Container, field string, privileged bool) ([]oci.SpecOpts, error) {
	p, field, err := appArmorProfile(pod, c, field)
	if err != nil {
		return nil, err
	}
	if !h.apparmor {
		if p != nil && p.Type != v1.AppArmorProfileTypeUnconfined {
			return nil, configError(field, "Cannot enforce AppArmor: AppArmor is not enabled on the host")
		}
		return nil, nil
	}
	if p == nil {
		p = &v1.AppArmorProfile{Type: v1.AppArmorProfileTypeRuntimeDefault}
	}
	switch p.Type {
	case v1.AppArmorProfileTypeUnconfined:
		return nil, nil
	case v1.AppArmorProfileTypeRuntimeDefault:
		if privileged {
			return nil, nil
		}
		return []oci.SpecOpts{withDefaultAppArmorProfile(appArmorDefaultProfile)}, nil
	case v1.AppArmorProfileTypeLocalhost:
		var name string
		if p.LocalhostProfile != nil {
			name = *p.LocalhostProfile
		}
		if !appArmorLoaded(name) {
			return nil, configError(field, "AppArmor profile %q is not loaded", name)
		}
		return []oci.SpecOpts{apparmor.WithProfile(name)}, nil
	}
	return nil, configError(field+".type", "unsupported value %q", p.Type)
}

// appArmorProfile finds the profile the kubelet v1.37 would use
// (pkg/security/apparmor GetProfile): the container's field, then its
// legacy annotation (still honoured for static pods, whose annotations
// nothing copies to fields), then the pod's field. An empty annotation,
// which validation lets through, names no profile.
func appArmorProfile(pod *v1.Pod, c *v1.Container, field string) (*v1.AppArmorProfile, string, error) {
	if c.SecurityContext != nil && c.SecurityContext.AppArmorProfile != nil {
		return c.SecurityContext.AppArmorProfile, field + ".appArmorProfile", nil
	}
	key := v1.DeprecatedAppArmorBetaContainerAnnotationKeyPrefix + c.Name
	if v := pod.Annotations[key]; v != "" {
		field := fmt.Sprintf("metadata.annotations[%s]", key)
		p, err := manifests.AppArmorAnnotationProfile(v)
		if err != nil {
			return nil, field, configError(field, "%v", err)
		}
		return p, field, nil
	}
	if s := pod.Spec.SecurityContext; s != nil && s.AppArmorProfile != nil {
		return s.AppArmorProfile, "spec.securityContext.appArmorProfile", nil
	}
	return nil, field, nil
}

// appArmorLoaded reports whether the kernel has a profile of that name, as
// the CRI plugin checks before using it.
func appArmorLoaded(name string) bool {
	if name == "" {
		return false
	}
	loaded, _ := appArmorListed(name + " (")
	return loaded
}

// legacySeccompAnnotations lists the container's seccomp annotations, which
// have no effect since Kubernetes 1.27 (as here); noderun warns of them.
func legacySeccompAnnotations(pod *v1.Pod, container string) []string {
	var keys []string
	for _, k := range []string{v1.SeccompPodAnnotationKey, v1.SeccompContainerAnnotationKeyPrefix + container} {
		if _, ok := pod.Annotations[k]; ok {
			keys = append(keys, k)
		}
	}
	return keys
}
