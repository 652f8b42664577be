package admission

import (
	"runtime"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func testNode() *v1.Node {
	return &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: NodeLabels("n1", map[string]string{"disk": "ssd"})},
		Status: v1.NodeStatus{Allocatable: v1.ResourceList{
			v1.ResourceCPU: resource.MustParse("2"), v1.ResourceMemory: resource.MustParse("1Gi"),
			v1.ResourcePods: resource.MustParse("3"), v1.ResourceEphemeralStorage: resource.MustParse("10Gi"),
		}},
	}
}

func reqs(kv ...string) v1.ResourceRequirements {
	r := v1.ResourceRequirements{Requests: v1.ResourceList{}}
	for i := 0; i < len(kv); i += 2 {
		r.Requests[v1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return r
}

type podOpt func(*v1.Pod)

func pod(opts ...podOpt) *v1.Pod {
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p-n1", Namespace: "default"},
		Spec: v1.PodSpec{NodeName: "n1", Containers: []v1.Container{{Name: "c"}}}}
	for _, o := range opts {
		o(p)
	}
	return p
}

func app(r v1.ResourceRequirements, ports ...v1.ContainerPort) podOpt {
	return func(p *v1.Pod) {
		p.Spec.Containers = append(p.Spec.Containers, v1.Container{Name: "app", Resources: r, Ports: ports})
	}
}

func initC(r v1.ResourceRequirements, sidecar bool) podOpt {
	return func(p *v1.Pod) {
		c := v1.Container{Name: "init", Resources: r}
		if sidecar {
			always := v1.ContainerRestartPolicyAlways
			c.RestartPolicy = &always
		}
		p.Spec.InitContainers = append(p.Spec.InitContainers, c)
	}
}

func TestPod(t *testing.T) {
	affinity := func(op v1.NodeSelectorOperator, vals ...string) podOpt {
		return func(p *v1.Pod) {
			p.Spec.Affinity = &v1.Affinity{NodeAffinity: &v1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &v1.NodeSelector{
				NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchExpressions: []v1.NodeSelectorRequirement{{Key: "disk", Operator: op, Values: vals}}}}}}}
		}
	}
	selector := func(kv map[string]string) podOpt { return func(p *v1.Pod) { p.Spec.NodeSelector = kv } }
	port := func(hostIP string, port int32, proto v1.Protocol) v1.ContainerPort {
		return v1.ContainerPort{ContainerPort: 80, HostPort: port, HostIP: hostIP, Protocol: proto}
	}
	onePodOf := func(r v1.ResourceRequirements, ports ...v1.ContainerPort) []*v1.Pod {
		return []*v1.Pod{pod(app(r, ports...))}
	}
	otherOS := "windows"
	if runtime.GOOS == "windows" {
		otherOS = "linux"
	}
	for _, tc := range []struct {
		name       string
		pod        *v1.Pod
		others     []*v1.Pod
		reason     string
		msg        string
		nilAllocOK bool // also admitted with no allocatable known
	}{
		{name: "empty pod", pod: pod()},
		{name: "selector matches", pod: pod(selector(map[string]string{"disk": "ssd", "kubernetes.io/os": runtime.GOOS}))},
		{name: "selector on hostname", pod: pod(selector(map[string]string{"kubernetes.io/hostname": "n1"}))},
		{name: "selector does not match", pod: pod(selector(map[string]string{"disk": "hdd"})),
			reason: "NodeAffinity", msg: "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector"},
		{name: "affinity In matches", pod: pod(affinity(v1.NodeSelectorOpIn, "ssd", "nvme"))},
		{name: "affinity NotIn", pod: pod(affinity(v1.NodeSelectorOpNotIn, "ssd")), reason: "NodeAffinity",
			msg: "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector"},
		{name: "affinity DoesNotExist", pod: pod(affinity(v1.NodeSelectorOpDoesNotExist)), reason: "NodeAffinity",
			msg: "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector"},
		{name: "os label", pod: pod(func(p *v1.Pod) { p.Labels = map[string]string{"kubernetes.io/os": otherOS} }),
			reason: "PodOSSelectorNodeLabelDoesNotMatch", msg: "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label"},
		{name: "os field", pod: pod(func(p *v1.Pod) { p.Spec.OS = &v1.PodOS{Name: v1.OSName(otherOS)} }),
			reason: "PodOSNotSupported", msg: "Failed to admit pod as the OS field doesn't match node OS"},
		{name: "os field matches", pod: pod(func(p *v1.Pod) { p.Spec.OS = &v1.PodOS{Name: v1.OSName(runtime.GOOS)} })},
		{name: "os label is checked before the os field", pod: pod(func(p *v1.Pod) {
			p.Labels = map[string]string{"kubernetes.io/os": otherOS}
			p.Spec.OS = &v1.PodOS{Name: v1.OSName(otherOS)}
		}), reason: "PodOSSelectorNodeLabelDoesNotMatch", msg: "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label"},
		{name: "os field is checked before resources", pod: pod(app(reqs("cpu", "3")), func(p *v1.Pod) { p.Spec.OS = &v1.PodOS{Name: v1.OSName(otherOS)} }),
			reason: "PodOSNotSupported", msg: "Failed to admit pod as the OS field doesn't match node OS"},
		{name: "cpu fits beside another", pod: pod(app(reqs("cpu", "1"))), others: onePodOf(reqs("cpu", "1"))},
		{name: "cpu does not fit beside another", pod: pod(app(reqs("cpu", "1500m"))), others: onePodOf(reqs("cpu", "1")),
			reason: "OutOfcpu", msg: "Node didn't have enough resource: cpu, requested: 1500, used: 1000, capacity: 2000", nilAllocOK: true},
		{name: "more cpu than the node has", pod: pod(app(reqs("cpu", "3"))),
			reason: "OutOfcpu", msg: "Node didn't have enough resource: cpu, requested: 3000, used: 0, capacity: 2000", nilAllocOK: true},
		{name: "memory", pod: pod(app(reqs("memory", "600Mi"))), others: onePodOf(reqs("memory", "500Mi")),
			reason: "OutOfmemory", msg: "Node didn't have enough resource: memory, requested: 629145600, used: 524288000, capacity: 1073741824", nilAllocOK: true},
		{name: "cpu is reported before memory", pod: pod(app(reqs("memory", "2Gi", "cpu", "3"))),
			reason: "OutOfcpu", msg: "Node didn't have enough resource: cpu, requested: 3000, used: 0, capacity: 2000", nilAllocOK: true},
		{name: "ephemeral-storage", pod: pod(app(reqs("ephemeral-storage", "11Gi"))),
			reason: "OutOfephemeral-storage", msg: "Node didn't have enough resource: ephemeral-storage, requested: 11811160064, used: 0, capacity: 10737418240", nilAllocOK: true},
		{name: "pods", pod: pod(), others: []*v1.Pod{pod(), pod(), pod()},
			reason: "OutOfpods", msg: "Node didn't have enough resource: pods, requested: 1, used: 3, capacity: 3", nilAllocOK: true},
		{name: "pods are checked before cpu", pod: pod(app(reqs("cpu", "3"))), others: []*v1.Pod{pod(), pod(), pod()},
			reason: "OutOfpods", msg: "Node didn't have enough resource: pods, requested: 1, used: 3, capacity: 3", nilAllocOK: true},
		{name: "resources are checked before affinity", pod: pod(app(reqs("cpu", "3")), selector(map[string]string{"disk": "hdd"})),
			reason: "OutOfcpu", msg: "Node didn't have enough resource: cpu, requested: 3000, used: 0, capacity: 2000"},
		{name: "an init container's larger request counts", pod: pod(app(reqs("cpu", "500m")), initC(reqs("cpu", "1500m"), false)),
			others: onePodOf(reqs("cpu", "1")), reason: "OutOfcpu", msg: "Node didn't have enough resource: cpu, requested: 1500, used: 1000, capacity: 2000", nilAllocOK: true},
		{name: "a sidecar adds to the app containers", pod: pod(app(reqs("cpu", "600m")), initC(reqs("cpu", "600m"), true)),
			others: onePodOf(reqs("cpu", "1")), reason: "OutOfcpu", msg: "Node didn't have enough resource: cpu, requested: 1200, used: 1000, capacity: 2000", nilAllocOK: true},
		{name: "another pod's init container counts by its max", pod: pod(app(reqs("cpu", "1"))),
			others: []*v1.Pod{pod(app(reqs("cpu", "100m")), initC(reqs("cpu", "1100m"), false))},
			reason: "OutOfcpu", msg: "Node didn't have enough resource: cpu, requested: 1000, used: 1100, capacity: 2000", nilAllocOK: true},
		{name: "overhead counts", pod: pod(app(reqs("cpu", "1")), func(p *v1.Pod) {
			p.Spec.Overhead = v1.ResourceList{v1.ResourceCPU: resource.MustParse("1500m")}
		}), reason: "OutOfcpu", msg: "Node didn't have enough resource: cpu, requested: 2500, used: 0, capacity: 2000", nilAllocOK: true},
		{name: "a pod-level request counts in place of its containers'", pod: pod(app(reqs("cpu", "200m")), func(p *v1.Pod) {
			p.Spec.Resources = &v1.ResourceRequirements{Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("1500m")}}
		}), others: onePodOf(reqs("cpu", "1")), reason: "OutOfcpu", msg: "Node didn't have enough resource: cpu, requested: 1500, used: 1000, capacity: 2000", nilAllocOK: true},
		{name: "another pod's pod-level request counts", pod: pod(app(reqs("cpu", "1"))),
			others: []*v1.Pod{pod(app(reqs("cpu", "100m")), func(p *v1.Pod) {
				p.Spec.Resources = &v1.ResourceRequirements{Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("1200m")}}
			})}, reason: "OutOfcpu", msg: "Node didn't have enough resource: cpu, requested: 1000, used: 1200, capacity: 2000", nilAllocOK: true},
		{name: "extended resource with no device plugin is admitted", pod: pod(app(reqs("example.com/foo", "2")))},
		{name: "host port taken", pod: pod(app(reqs(), port("", 8080, ""))), others: onePodOf(reqs(), port("", 8080, v1.ProtocolTCP)),
			reason: "NodePorts", msg: "Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports"},
		{name: "host port on another protocol", pod: pod(app(reqs(), port("", 8080, v1.ProtocolUDP))), others: onePodOf(reqs(), port("", 8080, ""))},
		{name: "host port on another IP", pod: pod(app(reqs(), port("10.0.0.1", 8080, ""))), others: onePodOf(reqs(), port("10.0.0.2", 8080, ""))},
		{name: "host port on all IPs and one", pod: pod(app(reqs(), port("10.0.0.1", 8080, ""))), others: onePodOf(reqs(), port("0.0.0.0", 8080, "")),
			reason: "NodePorts", msg: "Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Pod(tc.pod, tc.others, testNode())
			if got.Reason != tc.reason || got.Message != tc.msg {
				t.Errorf("got %q %q, want %q %q", got.Reason, got.Message, tc.reason, tc.msg)
			}
			if got.Admitted() != (tc.reason == "") {
				t.Errorf("Admitted() = %v with reason %q", got.Admitted(), got.Reason)
			}
			node := testNode()
			node.Status.Allocatable = nil
			if r := Pod(tc.pod, tc.others, node); r.Admitted() != (tc.reason == "" || tc.nilAllocOK) {
				t.Errorf("with no allocatable known: %+v", r)
			}
		})
	}
}

func TestStatusMessage(t *testing.T) {
	r := Result{"NodeAffinity", "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector"}
	if got, want := r.StatusMessage(), "Pod was rejected: Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
}

func TestParseNodeLabels(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    map[string]string
		wantErr string
	}{
		{in: "", want: map[string]string{}},
		{in: "disk=ssd, zone=a ,empty=", want: map[string]string{"disk": "ssd", "zone": "a", "empty": ""}},
		{in: "example.com/tier=edge,node.kubernetes.io/pool=x,kubelet.kubernetes.io/y=1,topology.kubernetes.io/zone=z",
			want: map[string]string{"example.com/tier": "edge", "node.kubernetes.io/pool": "x", "kubelet.kubernetes.io/y": "1", "topology.kubernetes.io/zone": "z"}},
		{in: "disk", wantErr: `"disk": malformed pair, expect string=string`},
		{in: "bad key=x", wantErr: `invalid node label key "bad key"`},
		{in: "k=bad value", wantErr: `invalid node label value "bad value" of k`},
		{in: "node-role.kubernetes.io/master=,foo.k8s.io/x=1", wantErr: "unknown 'kubernetes.io' or 'k8s.io' labels: [foo.k8s.io/x node-role.kubernetes.io/master]"},
	} {
		got, err := ParseNodeLabels(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: %v, want an error with %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || len(got) != len(tc.want) {
			t.Errorf("%q: %v %v, want %v", tc.in, got, err, tc.want)
			continue
		}
		for k, v := range tc.want {
			if got[k] != v {
				t.Errorf("%q: %s=%q, want %q", tc.in, k, got[k], v)
			}
		}
	}
}

func TestNodeLabels(t *testing.T) {
	got := NodeLabels("n1", map[string]string{"kubernetes.io/hostname": "edge-1", "disk": "ssd"})
	want := map[string]string{"kubernetes.io/hostname": "edge-1", "kubernetes.io/os": runtime.GOOS, "kubernetes.io/arch": runtime.GOARCH,
		"beta.kubernetes.io/os": runtime.GOOS, "beta.kubernetes.io/arch": runtime.GOARCH, "disk": "ssd"}
	if len(got) != len(want) {
		t.Fatalf("%v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s=%q, want %q", k, got[k], v)
		}
	}
}

func TestMatchesNode(t *testing.T) {
	p := pod(func(p *v1.Pod) { p.Spec.NodeSelector = map[string]string{"disk": "ssd"} })
	if !MatchesNode(p, "n1", map[string]string{"disk": "ssd"}) || MatchesNode(p, "n1", map[string]string{"disk": "hdd"}) {
		t.Error("nodeSelector not matched as the kubelet does")
	}
}
