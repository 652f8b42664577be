package runner

import (
	"fmt"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
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
		if (err == nil) != tc.ok {
			t.Errorf("%s allowed %v: %v, want ok=%v", tc.name, tc.allowed, err, tc.ok)
		}
		// The kubelet's text, with the name in dots.
		if want := fmt.Sprintf("%q not allowlisted", strings.ReplaceAll(tc.name, "/", ".")); err != nil && err.Error() != want {
			t.Errorf("%s: %q, want %q", tc.name, err, want)
		}
	}
}

func TestKernelHostname(t *testing.T) {
	yes, no := true, false
	long := "h23456789012345678901234567890" // with ".s.default.svc.cluster.local": 58
	for _, tc := range []struct {
		name      string
		spec      v1.PodSpec
		want      string
		wantErr   bool
		uts, file string
	}{
		{name: "no subdomain", spec: v1.PodSpec{Hostname: "h", SetHostnameAsFQDN: &yes}, want: "h"},
		{name: "subdomain", spec: v1.PodSpec{Hostname: "h", Subdomain: "s", SetHostnameAsFQDN: &yes}, want: "h.s.default.svc.cluster.local"},
		{name: "not asked", spec: v1.PodSpec{Hostname: "h", Subdomain: "s", SetHostnameAsFQDN: &no}, want: "h"},
		{name: "64 fits", spec: v1.PodSpec{Hostname: long + "123456", Subdomain: "s", SetHostnameAsFQDN: &yes}, want: long + "123456.s.default.svc.cluster.local"},
		{name: "65 does not", spec: v1.PodSpec{Hostname: long + "1234567", Subdomain: "s", SetHostnameAsFQDN: &yes}, wantErr: true},
		{name: "override wins over hostname and subdomain", spec: v1.PodSpec{HostnameOverride: ptr.To("node-a.example"), Hostname: "h", Subdomain: "s"}, want: "node-a.example"},
		{name: "override of 64 is cut to 63", spec: v1.PodSpec{HostnameOverride: ptr.To(long + long + "1234-")}, want: long + long + "123"},
		{name: "hostNetwork too long still fails", spec: v1.PodSpec{HostNetwork: true, Hostname: long + "1234567", Subdomain: "s", SetHostnameAsFQDN: &yes}, wantErr: true},
	} {
		pod := &v1.Pod{Spec: tc.spec}
		pod.Name, pod.Namespace = "web", "default"
		got, err := kernelHostname(pod)
		if (err != nil) != tc.wantErr || (!tc.wantErr && got != tc.want) {
			t.Errorf("%s: %q, %v; want %q (error %v)", tc.name, got, err, tc.want, tc.wantErr)
		}
		if err != nil && !strings.Contains(err.Error(), "is too long (64 characters is the max, 65 characters requested)") {
			t.Errorf("%s: message %q", tc.name, err)
		}
	}
}
