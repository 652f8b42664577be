package runner

import (
	"errors"
	"testing"

	v1 "k8s.io/api/core/v1"
)

func TestCheckSysctls(t *testing.T) {
	for _, tc := range []struct {
		name    string
		allowed []string
		ok      bool
	}{
		{"net.ipv4.ip_local_port_range", nil, true},
		{"kernel.shm_rmid_forced", nil, true},
		{"net/ipv4/tcp_syncookies", nil, true},
		{"kernel.msgmax", nil, false},
		{"kernel.msgmax", []string{"kernel.msg*"}, true},
		{"net.core.somaxconn", []string{"net.core.somaxconn"}, true},
		{"net.core.somaxconn", []string{"net.core.somaxconn2", "kernel.*"}, false},
	} {
		pod := &v1.Pod{Spec: v1.PodSpec{SecurityContext: &v1.PodSecurityContext{Sysctls: []v1.Sysctl{{Name: tc.name, Value: "1"}}}}}
		err := checkSysctls(pod, tc.allowed)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrContainerConfig)) {
			t.Errorf("%s allowed %v: %v, want ok=%v", tc.name, tc.allowed, err, tc.ok)
		}
	}
}
