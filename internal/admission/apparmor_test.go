package admission

import (
	"testing"

	v1 "k8s.io/api/core/v1"
)

// TestAppArmor is the kubelet's AppArmor admission on hosts with and
// without AppArmor (the host facts are the table's, not this machine's).
func TestAppArmor(t *testing.T) {
	profile := func(typ v1.AppArmorProfileType, name string) *v1.AppArmorProfile {
		p := &v1.AppArmorProfile{Type: typ}
		if name != "" {
			p.LocalhostProfile = &name
		}
		return p
	}
	podSC := func(p *v1.AppArmorProfile) podOpt {
		return func(pod *v1.Pod) { pod.Spec.SecurityContext = &v1.PodSecurityContext{AppArmorProfile: p} }
	}
	containerSC := func(p *v1.AppArmorProfile) podOpt {
		return func(pod *v1.Pod) { pod.Spec.Containers[0].SecurityContext = &v1.SecurityContext{AppArmorProfile: p} }
	}
	initSC := func(p *v1.AppArmorProfile) podOpt {
		return func(pod *v1.Pod) {
			pod.Spec.InitContainers = []v1.Container{{Name: "i", SecurityContext: &v1.SecurityContext{AppArmorProfile: p}}}
		}
	}
	annotations := func(kv ...string) podOpt {
		return func(pod *v1.Pod) {
			pod.Annotations = map[string]string{}
			for i := 0; i < len(kv); i += 2 {
				pod.Annotations[kv[i]] = kv[i+1]
			}
		}
	}
	const key = "container.apparmor.security.beta.kubernetes.io/c"
	const msg = "Cannot enforce AppArmor: AppArmor is not enabled on the host"
	for _, tc := range []struct {
		name     string
		pod      *v1.Pod
		required bool // rejected where AppArmor is not enabled
	}{
		{"no profile", pod(), false},
		{"pod Unconfined", pod(podSC(profile(v1.AppArmorProfileTypeUnconfined, ""))), false},
		{"container Unconfined", pod(containerSC(profile(v1.AppArmorProfileTypeUnconfined, ""))), false},
		{"pod RuntimeDefault", pod(podSC(profile(v1.AppArmorProfileTypeRuntimeDefault, ""))), true},
		{"pod Localhost", pod(podSC(profile(v1.AppArmorProfileTypeLocalhost, "k8s-deny-write"))), true},
		{"container Localhost", pod(containerSC(profile(v1.AppArmorProfileTypeLocalhost, "not-loaded"))), true},
		{"init container RuntimeDefault", pod(initSC(profile(v1.AppArmorProfileTypeRuntimeDefault, ""))), true},
		{"annotation localhost", pod(annotations(key, "localhost/k8s-deny-write")), true},
		{"annotation runtime/default", pod(annotations(key, "runtime/default")), true},
		{"annotation unconfined", pod(annotations(key, "unconfined")), false},
		{"one confined annotation of two", pod(annotations(key, "unconfined", key+"x", "runtime/default")), true},
		{"other annotation", pod(annotations("example.com/apparmor", "runtime/default")), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Where AppArmor is enabled v1.37 admits every profile: a
			// Localhost one not loaded fails later, at container creation.
			if got := AppArmor(tc.pod, true); !got.Admitted() {
				t.Errorf("AppArmor enabled: rejected %+v", got)
			}
			got := AppArmor(tc.pod, false)
			if !tc.required {
				if !got.Admitted() {
					t.Errorf("AppArmor not enabled: rejected %+v", got)
				}
				return
			}
			if got.Reason != "AppArmor" || got.Message != msg || got.StatusMessage() != "Pod was rejected: "+msg {
				t.Errorf("AppArmor not enabled: got %+v, want AppArmor %q", got, msg)
			}
		})
	}
}
