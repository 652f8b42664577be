package manifests

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestValidateSecurityContext(t *testing.T) {
	ctr := func(sc string) string {
		return podWith("  containers:\n  - name: app\n    image: nginx\n    securityContext: " + sc + "\n")
	}
	tests := []struct {
		name, in, wantErr string // wantErr "" for a valid pod
	}{
		{"hardened", ctr("{allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}, readOnlyRootFilesystem: true, seccompProfile: {type: RuntimeDefault}}"), ""},
		{"no escalation but privileged", ctr("{allowPrivilegeEscalation: false, privileged: true}"),
			"spec.containers[0].securityContext: cannot set `allowPrivilegeEscalation` to false and `privileged` to true"},
		{"no escalation but CAP_SYS_ADMIN", ctr("{allowPrivilegeEscalation: false, capabilities: {add: [CAP_SYS_ADMIN]}}"),
			"spec.containers[0].securityContext: cannot set `allowPrivilegeEscalation` to false and `capabilities.Add` CAP_SYS_ADMIN"},
		{"capability spellings", ctr("{capabilities: {drop: [all], add: [NET_ADMIN, CAP_SYS_TIME, chown]}}"), ""},
		{"unknown capability", ctr("{capabilities: {drop: [ALL, NET_RAWW]}}"),
			`spec.containers[0].securityContext.capabilities.drop[1]: unknown capability "NET_RAWW"`},
		{"procMount Default", ctr("{procMount: Default}"), ""},
		{"procMount Unmasked", ctr("{procMount: Unmasked}"), "spec.containers[0].securityContext.procMount: Invalid value: \"Unmasked\": `hostUsers` must be false to use `Unmasked`"},
		{"procMount Unmasked, hostUsers true", podWith("  hostUsers: true\n  containers:\n  - {name: app, image: nginx, securityContext: {procMount: Unmasked}}\n"),
			"spec.containers[0].securityContext.procMount: Invalid value: \"Unmasked\": `hostUsers` must be false"},
		{"procMount Unmasked, hostUsers false", podWith("  hostUsers: false\n  containers:\n  - {name: app, image: nginx, securityContext: {procMount: Unmasked}}\n"), ""},
		{"hostUsers false, hostNetwork", podWith("  hostUsers: false\n  hostNetwork: true\n" + oneContainer),
			"spec.hostNetwork: Forbidden: when `pod.Spec.HostUsers` is false"},
		{"hostUsers false, hostPID", podWith("  hostUsers: false\n  hostPID: true\n" + oneContainer),
			"spec.hostPID: Forbidden: when `pod.Spec.HostUsers` is false"},
		{"hostUsers false, hostIPC", podWith("  hostUsers: false\n  hostIPC: true\n" + oneContainer),
			"spec.hostIPC: Forbidden: when `pod.Spec.HostUsers` is false"},
		{"hostUsers false, shareProcessNamespace", podWith("  hostUsers: false\n  shareProcessNamespace: true\n" + oneContainer),
			"spec.shareProcessNamespace: noderun cannot share one PID namespace"},
		{"seccomp Localhost", ctr("{seccompProfile: {type: Localhost, localhostProfile: profiles/audit.json}}"), ""},
		{"seccomp Localhost without a name", ctr("{seccompProfile: {type: Localhost}}"),
			"spec.containers[0].securityContext.seccompProfile.localhostProfile: required when type is Localhost"},
		{"seccomp Localhost escapes", ctr("{seccompProfile: {type: Localhost, localhostProfile: ../../etc/x.json}}"),
			"spec.containers[0].securityContext.seccompProfile.localhostProfile: must be a relative path without '..'"},
		{"seccomp absolute", ctr("{seccompProfile: {type: Localhost, localhostProfile: /etc/x.json}}"),
			"spec.containers[0].securityContext.seccompProfile.localhostProfile: must be a relative path"},
		{"seccomp bad type", ctr("{seccompProfile: {type: Strict}}"), `spec.containers[0].securityContext.seccompProfile.type: unsupported value "Strict"`},
		{"seccomp name without Localhost", ctr("{seccompProfile: {type: RuntimeDefault, localhostProfile: x.json}}"),
			"spec.containers[0].securityContext.seccompProfile.localhostProfile: may only be set when type is Localhost"},
		{"apparmor missing type", ctr("{appArmorProfile: {}}"), "spec.containers[0].securityContext.appArmorProfile.type: required"},
		{"pod seccomp", podWith("  securityContext: {seccompProfile: {type: Localhost}}\n" + oneContainer),
			"spec.securityContext.seccompProfile.localhostProfile: required when type is Localhost"},
		{"pod apparmor", podWith("  securityContext: {appArmorProfile: {type: Bogus}}\n" + oneContainer),
			`spec.securityContext.appArmorProfile.type: unsupported value "Bogus"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := mustDecode(t, tt.in)
			ApplyDefaults(pod)
			errs := Validate(pod)
			if tt.wantErr == "" {
				if len(errs) > 0 {
					t.Fatalf("unexpected errors: %v", errors.Join(errs...))
				}
				return
			}
			if len(errs) != 1 || !strings.HasPrefix(errs[0].Error(), tt.wantErr) {
				t.Fatalf("got %v, want one error starting with %q", errors.Join(errs...), tt.wantErr)
			}
		})
	}
}

// AppArmor annotations on a static pod, as the kubelet v1.37 validates them
// (ValidatePodCreate) and the API server warns of them.
func TestAppArmorAnnotations(t *testing.T) {
	const key = "container.apparmor.security.beta.kubernetes.io/"
	pod := func(annotations, sc string) string {
		return "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  annotations: {" + annotations + "}\nspec:\n  containers:\n  - name: app\n    image: nginx\n" + sc
	}
	for _, tc := range []struct {
		name, in string
		errs     []string
		warnings []string
	}{
		{name: "runtime/default", in: pod(key+"app: runtime/default", ""),
			warnings: []string{"metadata.annotations[" + key + `app]: deprecated since v1.30; use the "appArmorProfile" field instead (it still applies to its container here, as on the kubelet v1.37)`}},
		{name: "with a matching field: no warning", in: pod(key+"app: localhost/p", "    securityContext: {appArmorProfile: {type: Localhost, localhostProfile: p}}\n")},
		{name: "unknown container", in: pod(key+"nope: unconfined", ""),
			errs: []string{"metadata.annotations[" + key + `nope]: Invalid value: "nope": container not found`}},
		{name: "bad value", in: pod(key+"app: enforce", ""),
			errs:     []string{"metadata.annotations[" + key + `app]: Invalid value: "enforce": invalid AppArmor profile name: "enforce"`},
			warnings: []string{"metadata.annotations[" + key + `app]: deprecated since v1.30; use the "appArmorProfile" field instead (it still applies to its container here, as on the kubelet v1.37)`}},
		{name: "field says otherwise", in: pod(key+"app: localhost/p", "    securityContext: {appArmorProfile: {type: Localhost, localhostProfile: q}}\n"),
			errs: []string{"spec.containers[0].securityContext.appArmorProfile.localhostProfile: apparmor profile in annotation and field must match"}},
		{name: "pod field says otherwise", in: pod(key+"app: unconfined", "  securityContext: {appArmorProfile: {type: RuntimeDefault}}\n"),
			errs:     []string{"spec.containers[0].securityContext.appArmorProfile.type: apparmor type in annotation and field must match"},
			warnings: []string{"metadata.annotations[" + key + `app]: deprecated since v1.30; use the "appArmorProfile" field instead (it still applies to its container here, as on the kubelet v1.37)`}},
		{name: "says what the pod's field says: no warning", in: pod(key+"app: runtime/default", "  securityContext: {appArmorProfile: {type: RuntimeDefault}}\n")},
	} {
		res := parseManifest([]byte(tc.in), "web.yaml", "n1", "file:/x", time.Now(), parseOptions{})
		var errs, warnings []string
		for _, e := range res.errs {
			errs = append(errs, e.(*ManifestError).Field+": "+e.(*ManifestError).Message)
		}
		for _, w := range res.warns {
			warnings = append(warnings, w.(*ManifestError).Field+": "+w.(*ManifestError).Message)
		}
		if !slices.Equal(errs, tc.errs) || !slices.Equal(warnings, tc.warnings) {
			t.Errorf("%s: errors %q warnings %q\nwant errors %q warnings %q", tc.name, errs, warnings, tc.errs, tc.warnings)
		}
	}
}
