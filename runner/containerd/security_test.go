package containerd

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/runner"
)

// containerd's 14 default capabilities, which CRI containers start with.
var defaultCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW", "CAP_SETGID",
	"CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

func secCfg(pod *v1.Pod) *runner.ContainerConfig {
	if len(pod.Spec.Containers) == 0 {
		pod.Spec.Containers = []v1.Container{{Name: "c"}}
	}
	return &runner.ContainerConfig{Pod: pod, Container: &pod.Spec.Containers[0]}
}

func podWith(sc *v1.SecurityContext) *v1.Pod {
	return &v1.Pod{Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c", SecurityContext: sc}}}}
}

// secSpec applies securityOpts for pod's first container on containerd's
// default spec.
func secSpec(t *testing.T, h hostSecurity, pod *v1.Pod) *oci.Spec {
	t.Helper()
	opts, err := h.securityOpts(secCfg(pod))
	if err != nil {
		t.Fatal(err)
	}
	return genSpec(t, opts...)
}

func secErr(t *testing.T, h hostSecurity, pod *v1.Pod, wantInMsg ...string) {
	t.Helper()
	_, err := h.securityOpts(secCfg(pod))
	if !errors.Is(err, runner.ErrContainerConfig) {
		t.Fatalf("err %v, want one wrapping ErrContainerConfig", err)
	}
	for _, w := range wantInMsg {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %q", err, w)
		}
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

func TestCapabilities(t *testing.T) {
	all := genSpec(t, oci.WithAllCurrentCapabilities).Process.Capabilities.Bounding
	for _, tc := range []struct {
		name string
		caps *v1.Capabilities
		want []string
	}{
		{"unset", nil, defaultCaps},
		{"drop ALL", &v1.Capabilities{Drop: []v1.Capability{"ALL"}}, nil},
		{"drop ALL add one", &v1.Capabilities{Drop: []v1.Capability{"ALL"}, Add: []v1.Capability{"NET_BIND_SERVICE"}}, []string{"CAP_NET_BIND_SERVICE"}},
		{"CAP_ prefix", &v1.Capabilities{Drop: []v1.Capability{"all"}, Add: []v1.Capability{"CAP_NET_ADMIN", "sys_time"}}, []string{"CAP_NET_ADMIN", "CAP_SYS_TIME"}},
		{"add ALL drop one", &v1.Capabilities{Add: []v1.Capability{"ALL"}, Drop: []v1.Capability{"CHOWN"}},
			slices.DeleteFunc(slices.Clone(all), func(c string) bool { return c == "CAP_CHOWN" })},
		{"drop one", &v1.Capabilities{Drop: []v1.Capability{"NET_RAW"}},
			slices.DeleteFunc(slices.Clone(defaultCaps), func(c string) bool { return c == "CAP_NET_RAW" })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := secSpec(t, hostSecurity{}, podWith(&v1.SecurityContext{Capabilities: tc.caps})).Process.Capabilities
			for set, got := range map[string][]string{"bounding": c.Bounding, "effective": c.Effective, "permitted": c.Permitted} {
				if !slices.Equal(sorted(got), sorted(tc.want)) {
					t.Errorf("%s = %v, want %v", set, got, tc.want)
				}
			}
			if len(c.Ambient) != 0 {
				t.Errorf("ambient = %v, want none", c.Ambient)
			}
		})
	}
	if len(all) <= len(defaultCaps) {
		t.Fatalf("all current capabilities %v: not more than the defaults", all)
	}
}

func TestDefaultMaskedPaths(t *testing.T) {
	s := secSpec(t, hostSecurity{}, podWith(nil))
	if !slices.Contains(s.Linux.MaskedPaths, "/proc/kcore") || !slices.Equal(s.Linux.MaskedPaths, defaultMaskedPaths) {
		t.Errorf("masked paths %v", s.Linux.MaskedPaths)
	}
	if !slices.Equal(s.Linux.ReadonlyPaths, defaultReadonlyPaths) {
		t.Errorf("readonly paths %v", s.Linux.ReadonlyPaths)
	}
	if s.Process.NoNewPrivileges || s.Root.Readonly || s.Linux.Seccomp != nil || s.Process.ApparmorProfile != "" {
		t.Errorf("unset securityContext: noNewPrivs %v, readonly root %v, seccomp %v, apparmor %q; want none",
			s.Process.NoNewPrivileges, s.Root.Readonly, s.Linux.Seccomp, s.Process.ApparmorProfile)
	}
}

func TestPrivileged(t *testing.T) {
	yes := true
	pod := podWith(&v1.SecurityContext{Privileged: &yes, SeccompProfile: &v1.SeccompProfile{Type: v1.SeccompProfileTypeRuntimeDefault}})
	s := secSpec(t, hostSecurity{}, pod)
	if len(s.Linux.MaskedPaths) != 0 || len(s.Linux.ReadonlyPaths) != 0 {
		t.Errorf("masked %v readonly %v, want none", s.Linux.MaskedPaths, s.Linux.ReadonlyPaths)
	}
	if len(s.Process.Capabilities.Bounding) <= len(defaultCaps) {
		t.Errorf("bounding %v, want all", s.Process.Capabilities.Bounding)
	}
	if s.Linux.Seccomp != nil {
		t.Error("privileged container got a seccomp profile")
	}
	for _, m := range s.Mounts {
		if (m.Destination == "/sys" || m.Destination == "/sys/fs/cgroup") && slices.Contains(m.Options, "ro") {
			t.Errorf("%s mounted read-only", m.Destination)
		}
	}
	allowAll := slices.ContainsFunc(s.Linux.Resources.Devices, func(d specs.LinuxDeviceCgroup) bool {
		return d.Allow && d.Type == "" && d.Major == nil && d.Access == "rwm"
	})
	if !allowAll || len(s.Linux.Devices) == 0 {
		t.Errorf("devices cgroup allows all %v, host devices %d", allowAll, len(s.Linux.Devices))
	}
}

func TestNoNewPrivsAndReadonlyRoot(t *testing.T) {
	no, yes := false, true
	s := secSpec(t, hostSecurity{}, podWith(&v1.SecurityContext{AllowPrivilegeEscalation: &no, ReadOnlyRootFilesystem: &yes}))
	if !s.Process.NoNewPrivileges || !s.Root.Readonly {
		t.Errorf("noNewPrivs %v, readonly root %v; want both", s.Process.NoNewPrivileges, s.Root.Readonly)
	}
	s = secSpec(t, hostSecurity{}, podWith(&v1.SecurityContext{AllowPrivilegeEscalation: &yes}))
	if s.Process.NoNewPrivileges {
		t.Error("allowPrivilegeEscalation true set NoNewPrivileges")
	}
}

func TestSeccomp(t *testing.T) {
	dir := t.TempDir()
	prof := `{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["mkdir"],"action":"SCMP_ACT_ERRNO"}]}`
	if err := os.WriteFile(filepath.Join(dir, "deny-mkdir.json"), []byte(prof), 0o644); err != nil {
		t.Fatal(err)
	}
	h := hostSecurity{seccompDir: filepath.Join(dir)}
	local := func(n string) *v1.SeccompProfile {
		return &v1.SeccompProfile{Type: v1.SeccompProfileTypeLocalhost, LocalhostProfile: &n}
	}
	rd := &v1.SeccompProfile{Type: v1.SeccompProfileTypeRuntimeDefault}
	unconfined := &v1.SeccompProfile{Type: v1.SeccompProfileTypeUnconfined}
	for _, tc := range []struct {
		name       string
		pod, ctr   *v1.SeccompProfile
		wantAction specs.LinuxSeccompAction // "" means no seccomp
	}{
		{"unset is unconfined", nil, nil, ""},
		{"container RuntimeDefault", nil, rd, specs.ActErrno},
		{"pod RuntimeDefault", rd, nil, specs.ActErrno},
		{"container overrides pod", rd, unconfined, ""},
		{"Localhost", nil, local("deny-mkdir.json"), specs.ActAllow},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := podWith(&v1.SecurityContext{SeccompProfile: tc.ctr})
			pod.Spec.SecurityContext = &v1.PodSecurityContext{SeccompProfile: tc.pod}
			s := secSpec(t, h, pod)
			if got := s.Linux.Seccomp; (got == nil) != (tc.wantAction == "") || got != nil && got.DefaultAction != tc.wantAction {
				t.Errorf("seccomp %+v, want default action %q", got, tc.wantAction)
			}
		})
	}
	secErr(t, h, podWith(&v1.SecurityContext{SeccompProfile: local("missing.json")}),
		"spec.containers[0].securityContext.seccompProfile.localhostProfile", filepath.Join(dir, "missing.json"))
	// A name leading out of the directory stays inside it.
	outside := filepath.Join(filepath.Dir(dir), "outside.json")
	if err := os.WriteFile(outside, []byte(prof), 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(outside)
	secErr(t, h, podWith(&v1.SecurityContext{SeccompProfile: local("../outside.json")}), filepath.Join(dir, "outside.json"))
}

func TestAppArmorWithoutHostSupport(t *testing.T) {
	h := hostSecurity{}
	rd := &v1.AppArmorProfile{Type: v1.AppArmorProfileTypeRuntimeDefault}
	secErr(t, h, podWith(&v1.SecurityContext{AppArmorProfile: rd}),
		"spec.containers[0].securityContext.appArmorProfile", "Cannot enforce AppArmor: AppArmor is not enabled on the host")
	pod := podWith(nil)
	pod.Spec.SecurityContext = &v1.PodSecurityContext{AppArmorProfile: rd}
	secErr(t, h, pod, "spec.securityContext.appArmorProfile")
	pod = podWith(nil)
	pod.Annotations = map[string]string{"container.apparmor.security.beta.kubernetes.io/c": "localhost/foo"}
	secErr(t, h, pod, "metadata.annotations[container.apparmor.security.beta.kubernetes.io/c]")
	pod.Annotations["container.apparmor.security.beta.kubernetes.io/c"] = "unconfined"
	if s := secSpec(t, h, pod); s.Process.ApparmorProfile != "" {
		t.Errorf("unconfined: profile %q", s.Process.ApparmorProfile)
	}
}

func TestAppArmorWithHostSupport(t *testing.T) {
	h := hostSecurity{apparmor: true}
	yes := true
	// Unset means RuntimeDefault (one option, which loads the profile when
	// applied); privileged containers and Unconfined get none.
	for _, tc := range []struct {
		name string
		sc   *v1.SecurityContext
		want int
	}{
		{"unset", nil, 1},
		{"privileged", &v1.SecurityContext{Privileged: &yes}, 0},
		{"unconfined", &v1.SecurityContext{AppArmorProfile: &v1.AppArmorProfile{Type: v1.AppArmorProfileTypeUnconfined}}, 0},
	} {
		c := secCfg(podWith(tc.sc))
		opts, err := h.appArmorOpt(c.Pod, c.Container, "f", tc.sc != nil && tc.sc.Privileged != nil)
		if err != nil || len(opts) != tc.want {
			t.Errorf("%s: %d options, err %v; want %d", tc.name, len(opts), err, tc.want)
		}
	}
	name := "noderun-test-not-loaded"
	secErr(t, h, podWith(&v1.SecurityContext{AppArmorProfile: &v1.AppArmorProfile{Type: v1.AppArmorProfileTypeLocalhost, LocalhostProfile: &name}}), name)
}

func TestSELinuxOptions(t *testing.T) {
	pod := podWith(&v1.SecurityContext{SELinuxOptions: &v1.SELinuxOptions{Level: "s0:c1"}})
	if _, err := (hostSecurity{}).securityOpts(secCfg(pod)); err != nil {
		t.Errorf("without SELinux the options are ignored, as by containerd: %v", err)
	}
	secErr(t, hostSecurity{selinux: true}, pod, "spec.containers[0].securityContext.seLinuxOptions")
}

func TestLegacySeccompAnnotations(t *testing.T) {
	pod := &v1.Pod{}
	pod.Annotations = map[string]string{
		"seccomp.security.alpha.kubernetes.io/pod":             "runtime/default",
		"container.seccomp.security.alpha.kubernetes.io/c":     "runtime/default",
		"container.seccomp.security.alpha.kubernetes.io/other": "runtime/default",
	}
	got := legacySeccompAnnotations(pod, "c")
	want := []string{"seccomp.security.alpha.kubernetes.io/pod", "container.seccomp.security.alpha.kubernetes.io/c"}
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	// They have no effect on the spec.
	if s := secSpec(t, hostSecurity{}, pod); s.Linux.Seccomp != nil {
		t.Error("a legacy annotation applied a seccomp profile")
	}
}
