package manifests

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func TestPullPolicy(t *testing.T) {
	tests := []struct {
		in   string
		want v1.PullPolicy
	}{
		{"nginx", v1.PullAlways},
		{"nginx:latest", v1.PullAlways},
		{"nginx:1.29", v1.PullIfNotPresent},
		{"localhost:5000/nginx", v1.PullAlways},
		{"localhost:5000/nginx:1.29", v1.PullIfNotPresent},
		{"nginx@sha256:0123", v1.PullIfNotPresent},
		{"nginx:latest@sha256:0123", v1.PullIfNotPresent},
		{"registry.k8s.io/etcd:3.5.15-0", v1.PullIfNotPresent},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			if got := pullPolicy(tt.in); got != tt.want {
				t.Errorf("pullPolicy(%q) = %s, want %s", tt.in, got, tt.want)
			}
		})
	}
}

func TestApplyDefaults(t *testing.T) {
	pod := mustDecode(t, `
apiVersion: v1
kind: Pod
metadata: {name: a}
spec:
  hostNetwork: true
  initContainers:
  - {name: init, image: "busybox:1.36"}
  containers:
  - name: c
    image: nginx
    ports: [{containerPort: 80}]
    env: [{name: NODE, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}]
    resources: {limits: {cpu: 500m}}
    livenessProbe: {httpGet: {port: 80}}
    lifecycle: {preStop: {httpGet: {port: 80}}}
  volumes:
  - {name: h, hostPath: {path: /srv}}
  - {name: d, downwardAPI: {items: [{path: name, fieldRef: {fieldPath: metadata.name}}]}}
  - {name: i, image: {reference: "tools:1.2"}}
  - {name: l, image: {reference: tools}}
`)
	ApplyDefaults(pod)
	s := pod.Spec
	c := s.Containers[0]
	checks := []struct {
		name      string
		got, want any
	}{
		{"restartPolicy", s.RestartPolicy, v1.RestartPolicyAlways},
		{"terminationGracePeriodSeconds", *s.TerminationGracePeriodSeconds, int64(30)},
		{"dnsPolicy", s.DNSPolicy, v1.DNSClusterFirst},
		{"schedulerName", s.SchedulerName, "default-scheduler"},
		{"enableServiceLinks", *s.EnableServiceLinks, true},
		{"securityContext", s.SecurityContext != nil, true},
		{"init imagePullPolicy", s.InitContainers[0].ImagePullPolicy, v1.PullIfNotPresent},
		{"imagePullPolicy", c.ImagePullPolicy, v1.PullAlways},
		{"image volume pullPolicy, tagged", s.Volumes[2].Image.PullPolicy, v1.PullIfNotPresent},
		{"image volume pullPolicy, untagged", s.Volumes[3].Image.PullPolicy, v1.PullAlways},
		{"terminationMessagePath", c.TerminationMessagePath, "/dev/termination-log"},
		{"terminationMessagePolicy", c.TerminationMessagePolicy, v1.TerminationMessageReadFile},
		{"port protocol", c.Ports[0].Protocol, v1.ProtocolTCP},
		{"hostPort with hostNetwork", c.Ports[0].HostPort, int32(80)},
		{"fieldRef apiVersion", c.Env[0].ValueFrom.FieldRef.APIVersion, "v1"},
		{"requests from limits", c.Resources.Requests.Cpu().String(), "500m"},
		{"probe period", c.LivenessProbe.PeriodSeconds, int32(10)},
		{"probe timeout", c.LivenessProbe.TimeoutSeconds, int32(1)},
		{"probe success", c.LivenessProbe.SuccessThreshold, int32(1)},
		{"probe failure", c.LivenessProbe.FailureThreshold, int32(3)},
		{"probe path", c.LivenessProbe.HTTPGet.Path, "/"},
		{"probe scheme", c.LivenessProbe.HTTPGet.Scheme, v1.URISchemeHTTP},
		{"preStop scheme", c.Lifecycle.PreStop.HTTPGet.Scheme, v1.URISchemeHTTP},
		{"hostPath type", *s.Volumes[0].HostPath.Type, v1.HostPathUnset},
		{"downwardAPI mode", *s.Volumes[1].DownwardAPI.DefaultMode, int32(0o644)},
		{"downwardAPI fieldRef apiVersion", s.Volumes[1].DownwardAPI.Items[0].FieldRef.APIVersion, "v1"},
	}
	for _, ch := range checks {
		if ch.got != ch.want {
			t.Errorf("%s = %v, want %v", ch.name, ch.got, ch.want)
		}
	}
}

func TestApplyDefaultsKeepsSetValues(t *testing.T) {
	pod := mustDecode(t, `
apiVersion: v1
kind: Pod
metadata: {name: a}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 5
  dnsPolicy: Default
  enableServiceLinks: false
  containers:
  - name: c
    image: nginx
    imagePullPolicy: Never
    resources: {limits: {cpu: "1"}, requests: {cpu: 100m}}
`)
	ApplyDefaults(pod)
	s := pod.Spec
	c := s.Containers[0]
	if s.RestartPolicy != v1.RestartPolicyNever || *s.TerminationGracePeriodSeconds != 5 ||
		s.DNSPolicy != v1.DNSDefault || *s.EnableServiceLinks || c.ImagePullPolicy != v1.PullNever ||
		!c.Resources.Requests.Cpu().Equal(resource.MustParse("100m")) {
		t.Errorf("ApplyDefaults overrode a set value: %+v", s)
	}
}

func mustDecode(t *testing.T, in string) *v1.Pod {
	t.Helper()
	pods, err := Decode([]byte(in))
	if err != nil || len(pods) != 1 {
		t.Fatalf("Decode: %d pods, %v", len(pods), err)
	}
	return pods[0]
}
