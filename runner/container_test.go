package runner

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/noderun/noderun/manifests"
)

func TestContainerArgsMergeLikeKubernetes(t *testing.T) {
	img := ImageConfig{Entrypoint: []string{"/ep", "$(V)"}, Cmd: []string{"cmd"}}
	env := []envVar{{"V", "val"}}
	for _, tc := range []struct {
		name          string
		command, args []string
		want          []string
	}{
		{"image defaults, not expanded", nil, nil, []string{"/ep", "$(V)", "cmd"}},
		{"args replace cmd only", nil, []string{"a", "$(V)"}, []string{"/ep", "$(V)", "a", "val"}},
		{"command drops image cmd", []string{"sh", "$(V)"}, nil, []string{"sh", "val"}},
		{"command and args", []string{"sh"}, []string{"-c", "echo $(V)"}, []string{"sh", "-c", "echo val"}},
	} {
		c := &v1.Container{Command: tc.command, Args: tc.args}
		if got := containerArgs(c, img, env); !slices.Equal(got, tc.want) {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestContainerEnv(t *testing.T) {
	mem := resource.MustParse("64Mi")
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p-n1", Namespace: "ns", UID: "u", Labels: map[string]string{"app": "web"}},
		Spec:       v1.PodSpec{NodeName: "n1"},
	}
	c := &v1.Container{
		Resources: v1.ResourceRequirements{Limits: v1.ResourceList{v1.ResourceMemory: mem}},
		Env: []v1.EnvVar{
			{Name: "POD", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
			{Name: "GREETING", Value: "hi $(POD) on $(NODE)"}, // NODE is defined later: stays literal
			{Name: "NODE", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
			{Name: "APP", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.labels['app']"}}},
			{Name: "IP", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
			{Name: "HOST", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "status.hostIP"}}},
			{Name: "MEM_MI", ValueFrom: &v1.EnvVarSource{ResourceFieldRef: &v1.ResourceFieldSelector{
				Resource: "limits.memory", Divisor: resource.MustParse("1Mi")}}},
		},
	}
	env, err := containerEnv(pod, c, t.TempDir(), []string{"10.1.0.5"}, "192.0.2.1", &configObjects{})
	if err != nil {
		t.Fatal(err)
	}
	got := mergeEnv([]string{"PATH=/bin", "APP=image"}, env)
	want := []string{"PATH=/bin", "APP=web", "POD=p-n1", "GREETING=hi p-n1 on $(NODE)", "NODE=n1",
		"IP=10.1.0.5", "HOST=192.0.2.1", "MEM_MI=64"}
	if !slices.Equal(got, want) {
		t.Fatalf("env\n got %q\nwant %q", got, want)
	}
}

// ConfigMaps and Secrets: envFrom first (keys sorted, prefixed), env over
// it, $(VAR) seeing both; a missing reference is the kubelet's error text.
func TestContainerEnvFromConfigObjects(t *testing.T) {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}}
	objs := &configObjects{}
	yes := true
	objs.set(map[string]manifests.Snapshot{"file:/a": {
		ConfigMaps: []*v1.ConfigMap{{ObjectMeta: metav1.ObjectMeta{Name: "cfg", Namespace: "ns"}, Data: map[string]string{"b": "2", "a": "1"}}},
		Secrets:    []*v1.Secret{{ObjectMeta: metav1.ObjectMeta{Name: "sec", Namespace: "ns"}, Data: map[string][]byte{"pw": []byte("s3")}}},
	}})
	cmKey := func(name, key string, opt bool) *v1.EnvVarSource {
		return &v1.EnvVarSource{ConfigMapKeyRef: &v1.ConfigMapKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: name}, Key: key, Optional: &opt}}
	}
	c := &v1.Container{
		EnvFrom: []v1.EnvFromSource{
			{Prefix: "C_", ConfigMapRef: &v1.ConfigMapEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "cfg"}}},
			{SecretRef: &v1.SecretEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "gone"}, Optional: &yes}},
		},
		Env: []v1.EnvVar{
			{Name: "C_a", Value: "over $(C_b)"},
			{Name: "PW", ValueFrom: &v1.EnvVarSource{SecretKeyRef: &v1.SecretKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "sec"}, Key: "pw"}}},
			{Name: "NONE", ValueFrom: cmKey("cfg", "nokey", true)},
			{Name: "B", ValueFrom: cmKey("cfg", "b", false)},
		},
	}
	env, err := containerEnv(pod, c, t.TempDir(), nil, "", objs)
	if err != nil {
		t.Fatal(err)
	}
	got, want := mergeEnv(nil, env), []string{"C_a=over 2", "C_b=2", "PW=s3", "B=2"}
	if !slices.Equal(got, want) {
		t.Fatalf("env\n got %q\nwant %q", got, want)
	}
	for _, tt := range []struct {
		src  *v1.EnvVarSource
		want string
	}{
		{cmKey("nope", "k", false), `configmap "nope" not found`},
		{cmKey("cfg", "k", false), "couldn't find key k in ConfigMap ns/cfg"},
		{&v1.EnvVarSource{SecretKeyRef: &v1.SecretKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "sec"}, Key: "k"}}, "couldn't find key k in Secret ns/sec"},
		{&v1.EnvVarSource{SecretKeyRef: &v1.SecretKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "x"}, Key: "k"}}, `secret "x" not found`},
	} {
		bad := &v1.Container{Env: []v1.EnvVar{{Name: "V", ValueFrom: tt.src}}}
		if _, err := containerEnv(pod, bad, t.TempDir(), nil, "", objs); err == nil || err.Error() != tt.want {
			t.Errorf("err = %v, want %q", err, tt.want)
		}
	}
}

func TestResolvConf(t *testing.T) {
	host := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(host, []byte("# comment\nnameserver 10.0.0.1\nsearch example.com\noptions ndots:2 edns0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	five := "5"
	for _, tc := range []struct {
		name   string
		policy v1.DNSPolicy
		cfg    *v1.PodDNSConfig
		want   string
	}{
		{"Default copies the host", v1.DNSDefault, nil,
			"nameserver 10.0.0.1\nsearch example.com\noptions ndots:2 edns0\n"},
		{"ClusterFirst falls back to the host", v1.DNSClusterFirst, nil,
			"nameserver 10.0.0.1\nsearch example.com\noptions ndots:2 edns0\n"},
		{"dnsConfig merges", v1.DNSDefault, &v1.PodDNSConfig{Nameservers: []string{"1.1.1.1"}, Searches: []string{"a.local"},
			Options: []v1.PodDNSConfigOption{{Name: "ndots", Value: &five}}},
			"nameserver 10.0.0.1\nnameserver 1.1.1.1\nsearch example.com a.local\noptions ndots:5 edns0\n"},
		{"None uses only dnsConfig", v1.DNSNone, &v1.PodDNSConfig{Nameservers: []string{"9.9.9.9", "8.8.8.8", "7.7.7.7", "6.6.6.6"}},
			"nameserver 9.9.9.9\nnameserver 8.8.8.8\nnameserver 7.7.7.7\n"},
	} {
		pod := &v1.Pod{Spec: v1.PodSpec{DNSPolicy: tc.policy, DNSConfig: tc.cfg}}
		d, err := resolvConfig(pod, host)
		if err != nil {
			t.Fatal(err)
		}
		if got := renderResolvConf(d); string(got) != tc.want {
			t.Errorf("%s:\n got %q\nwant %q", tc.name, got, tc.want)
		}
	}
}

func TestHostsFile(t *testing.T) {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-n1"}, Spec: v1.PodSpec{
		HostAliases: []v1.HostAlias{{IP: "10.9.9.9", Hostnames: []string{"db", "db.local"}}}}}
	b, err := hostsFile(pod, []string{"10.1.0.5"})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"127.0.0.1\tlocalhost\n", "10.1.0.5\tweb-n1\n", "10.9.9.9\tdb\tdb.local\n"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("hosts file lacks %q:\n%s", want, b)
		}
	}
}

// A hostnameOverride is the pod's only name in /etc/hosts: no domain, as
// the kubelet (GeneratePodHostNameAndDomain returns none with it).
func TestHostsFileHostnameOverride(t *testing.T) {
	name := "node-a.example"
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-n1", Namespace: "default"},
		Spec: v1.PodSpec{HostnameOverride: &name, Hostname: "h", Subdomain: "s"}}
	b, err := hostsFile(pod, []string{"10.1.0.5"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(string(b), "\n10.1.0.5\tnode-a.example\n") {
		t.Errorf("hosts file:\n%s", b)
	}
}

func TestPodPhase(t *testing.T) {
	running := v1.ContainerStatus{State: v1.ContainerState{Running: &v1.ContainerStateRunning{}}}
	ok := v1.ContainerStatus{State: v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: 0}}}
	failed := v1.ContainerStatus{State: v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: 1}}}
	waiting := v1.ContainerStatus{State: v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: "ContainerCreating"}}}
	backoff := v1.ContainerStatus{State: v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
		LastTerminationState: v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: 1}}}
	never, always := v1.ContainerRestartPolicyNever, v1.ContainerRestartPolicyAlways
	restartOn42 := v1.Container{RestartPolicy: &never, RestartPolicyRules: []v1.ContainerRestartRule{
		{Action: v1.ContainerRestartRuleActionRestart, ExitCodes: &v1.ContainerRestartRuleOnExitCodes{Operator: v1.ContainerRestartRuleOnExitCodesOpIn, Values: []int32{42}}}}}
	exit := func(code int32) v1.ContainerStatus {
		return v1.ContainerStatus{State: v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: code}}}
	}
	for _, tc := range []struct {
		name       string
		policy     v1.RestartPolicy
		statuses   []v1.ContainerStatus
		initDone   bool
		want       v1.PodPhase
		containers []v1.Container // default: plain ones, one per status
	}{
		{"always pod, Never container failed, other ok", v1.RestartPolicyAlways, []v1.ContainerStatus{failed, ok}, true, v1.PodFailed,
			[]v1.Container{{RestartPolicy: &never}, {RestartPolicy: &never}}},
		{"never pod, Always container stopped restarts", v1.RestartPolicyNever, []v1.ContainerStatus{ok}, true, v1.PodRunning,
			[]v1.Container{{RestartPolicy: &always}}},
		{"rule In matches: restarts", v1.RestartPolicyNever, []v1.ContainerStatus{exit(42)}, true, v1.PodRunning, []v1.Container{restartOn42}},
		{"rule In does not match: final", v1.RestartPolicyNever, []v1.ContainerStatus{exit(3)}, true, v1.PodFailed, []v1.Container{restartOn42}},
		{"init pending", v1.RestartPolicyAlways, []v1.ContainerStatus{waiting}, false, v1.PodPending, nil},
		{"creating", v1.RestartPolicyAlways, []v1.ContainerStatus{waiting}, true, v1.PodPending, nil},
		{"running", v1.RestartPolicyAlways, []v1.ContainerStatus{running, ok}, true, v1.PodRunning, nil},
		{"crash loop counts as running", v1.RestartPolicyAlways, []v1.ContainerStatus{backoff}, true, v1.PodRunning, nil},
		{"never: all ok", v1.RestartPolicyNever, []v1.ContainerStatus{ok, ok}, true, v1.PodSucceeded, nil},
		{"never: one failed", v1.RestartPolicyNever, []v1.ContainerStatus{ok, failed}, true, v1.PodFailed, nil},
		{"onfailure: all ok", v1.RestartPolicyOnFailure, []v1.ContainerStatus{ok}, true, v1.PodSucceeded, nil},
		{"onfailure: failed restarts", v1.RestartPolicyOnFailure, []v1.ContainerStatus{backoff}, true, v1.PodRunning, nil},
	} {
		cs := tc.containers
		if cs == nil {
			cs = make([]v1.Container, len(tc.statuses))
		}
		pod := &v1.Pod{Spec: v1.PodSpec{RestartPolicy: tc.policy, Containers: cs}}
		s := &v1.PodStatus{ContainerStatuses: tc.statuses}
		if got := podPhase(pod, s, tc.initDone); got != tc.want {
			t.Errorf("%s: phase %s, want %s", tc.name, got, tc.want)
		}
	}
}

func TestContainerIDFitsContainerd(t *testing.T) {
	long := strings.Repeat("a", 63)
	for _, name := range []string{"web", long} {
		id := ContainerID("some-uid", name, 123)
		if len(id) > 76 {
			t.Errorf("id %q is %d chars; containerd allows 76", id, len(id))
		}
		if ContainerID("some-uid", name, 124) == id || ContainerID("other", name, 123) == id {
			t.Errorf("ids must differ per restart and per pod")
		}
	}
}
