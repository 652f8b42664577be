package admission

import (
	"os"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// The kubelet's AppArmor admit handler (pkg/kubelet/lifecycle, with
// pkg/security/apparmor's validator).
const (
	ReasonAppArmor        = "AppArmor"
	appArmorMessagePrefix = "Cannot enforce AppArmor: "
	appArmorNotEnabled    = "AppArmor is not enabled on the host"
)

// AppArmor decides as the kubelet's AppArmor admit handler: a pod that
// asks for a profile other than Unconfined (its own field, a container's,
// or the legacy container annotation) is rejected on a host that does not
// enforce AppArmor. Where it does, v1.37 checks nothing more at admission:
// a Localhost profile that is not loaded fails at container creation, in
// the runtime. hostEnabled is HostAppArmor's answer, read once at start as
// the kubelet's validator does.
func AppArmor(pod *v1.Pod, hostEnabled bool) Result {
	if hostEnabled || !appArmorRequired(pod) {
		return Result{}
	}
	return Result{ReasonAppArmor, appArmorMessagePrefix + appArmorNotEnabled}
}

// appArmorRequired reports whether any profile other than Unconfined is
// asked for. The kubelet stops at the first container annotation its map
// iteration meets, so with several annotations its answer varies; any
// confined one counts here, which is what its comment says it means.
func appArmorRequired(pod *v1.Pod) bool {
	confined := func(p *v1.AppArmorProfile) bool {
		return p != nil && p.Type != v1.AppArmorProfileTypeUnconfined
	}
	if sc := pod.Spec.SecurityContext; sc != nil && confined(sc.AppArmorProfile) {
		return true
	}
	for _, cs := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range cs {
			if c.SecurityContext != nil && confined(c.SecurityContext.AppArmorProfile) {
				return true
			}
		}
	}
	for k, v := range pod.Annotations {
		if strings.HasPrefix(k, v1.DeprecatedAppArmorBetaContainerAnnotationKeyPrefix) &&
			v != v1.DeprecatedAppArmorBetaProfileNameUnconfined {
			return true
		}
	}
	return false
}

// HostAppArmor reports whether the host enforces AppArmor, as the kubelet
// asks runc's apparmor.IsEnabled: the securityfs directory exists and the
// module says it is enabled.
func HostAppArmor() bool {
	if _, err := os.Stat("/sys/kernel/security/apparmor"); err != nil {
		return false
	}
	b, err := os.ReadFile("/sys/module/apparmor/parameters/enabled")
	return err == nil && len(b) > 1 && b[0] == 'Y'
}
