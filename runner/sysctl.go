package runner

import (
	"fmt"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/manifests"
)

// safeSysctls are the sysctls the kubelet allows every pod (its
// pkg/kubelet/sysctl safe set): each stays inside the pod's namespaces and
// cannot starve the node.
var safeSysctls = []string{
	"kernel.shm_rmid_forced",
	"net.ipv4.ip_local_port_range",
	"net.ipv4.tcp_syncookies",
	"net.ipv4.ping_group_range",
	"net.ipv4.ip_unprivileged_port_start",
	"net.ipv4.ip_local_reserved_ports",
	"net.ipv4.tcp_keepalive_time",
	"net.ipv4.tcp_fin_timeout",
	"net.ipv4.tcp_keepalive_intvl",
	"net.ipv4.tcp_keepalive_probes",
	"net.ipv4.tcp_rmem",
	"net.ipv4.tcp_wmem",
}

// checkSysctls refuses, as the kubelet's sysctl admit handler does, a pod
// sysctl that is neither safe nor matched by allowedUnsafe (names, or
// prefixes ending in "*", as --allowed-unsafe-sysctls takes them); the
// error is the kubelet's text.
func checkSysctls(pod *v1.Pod, allowedUnsafe []string) error {
	sc := pod.Spec.SecurityContext
	if sc == nil {
		return nil
	}
	for _, s := range sc.Sysctls {
		name := manifests.SysctlName(s.Name)
		if slices.Contains(safeSysctls, name) || slices.ContainsFunc(allowedUnsafe, func(p string) bool {
			prefix, wild := strings.CutSuffix(p, "*")
			return name == p || wild && strings.HasPrefix(name, prefix)
		}) {
			continue
		}
		return fmt.Errorf("%q not allowlisted", name)
	}
	return nil
}
