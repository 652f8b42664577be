package admission

import (
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	resourcehelper "k8s.io/component-helpers/resource"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
)

// matchesAffinity gives the answer of the scheduler's matcher, which the
// kubelet calls, on every operator, valid or not.
func TestMatchesAffinityAsTheLibrary(t *testing.T) {
	node := &v1.Node{}
	node.Name = "n1"
	node.Labels = map[string]string{"disk": "ssd", "cores": "8", "zone": "a", "bad": "x8"}
	req := func(key string, op v1.NodeSelectorOperator, vals ...string) v1.NodeSelectorRequirement {
		return v1.NodeSelectorRequirement{Key: key, Operator: op, Values: vals}
	}
	var reqs []v1.NodeSelectorRequirement
	for _, key := range []string{"disk", "cores", "missing", "bad", "bad key"} {
		for _, op := range []v1.NodeSelectorOperator{"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt", "Other"} {
			for _, vals := range [][]string{nil, {"ssd"}, {"hdd", "ssd"}, {"7"}, {"9"}, {"x"}, {"7", "9"}, {"bad value"}} {
				reqs = append(reqs, req(key, op, vals...))
			}
		}
	}
	var fieldReqs []v1.NodeSelectorRequirement
	for _, key := range []string{"metadata.name", "metadata.uid"} {
		for _, op := range []v1.NodeSelectorOperator{"In", "NotIn", "Exists"} {
			for _, vals := range [][]string{nil, {"n1"}, {"n2"}, {"n1", "n2"}} {
				fieldReqs = append(fieldReqs, req(key, op, vals...))
			}
		}
	}
	var cases []*v1.Pod
	affinity := func(terms ...v1.NodeSelectorTerm) *v1.Pod {
		p := &v1.Pod{}
		p.Spec.Affinity = &v1.Affinity{NodeAffinity: &v1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &v1.NodeSelector{NodeSelectorTerms: terms}}}
		return p
	}
	for _, r := range reqs {
		cases = append(cases, affinity(v1.NodeSelectorTerm{MatchExpressions: []v1.NodeSelectorRequirement{r}}))
		// ANDed with a requirement that holds, ORed with a term that fails.
		cases = append(cases, affinity(v1.NodeSelectorTerm{MatchExpressions: []v1.NodeSelectorRequirement{req("zone", "In", "a"), r}},
			v1.NodeSelectorTerm{MatchExpressions: []v1.NodeSelectorRequirement{req("zone", "In", "b")}}))
	}
	for _, r := range fieldReqs {
		cases = append(cases, affinity(v1.NodeSelectorTerm{MatchFields: []v1.NodeSelectorRequirement{r}}))
		cases = append(cases, affinity(v1.NodeSelectorTerm{MatchFields: []v1.NodeSelectorRequirement{r},
			MatchExpressions: []v1.NodeSelectorRequirement{req("disk", "In", "ssd")}}))
	}
	cases = append(cases, affinity(), affinity(v1.NodeSelectorTerm{}),
		affinity(v1.NodeSelectorTerm{}, v1.NodeSelectorTerm{MatchExpressions: []v1.NodeSelectorRequirement{req("disk", "Exists")}}))
	for _, sel := range []map[string]string{{"disk": "ssd"}, {"disk": "hdd"}, {"missing": ""}, {"disk": "ssd", "zone": "a"}} {
		p := affinity(v1.NodeSelectorTerm{MatchExpressions: []v1.NodeSelectorRequirement{req("cores", "Gt", "4")}})
		p.Spec.NodeSelector = sel
		cases = append(cases, p, &v1.Pod{Spec: v1.PodSpec{NodeSelector: sel}})
	}
	for i, p := range cases {
		want, _ := nodeaffinity.GetRequiredNodeAffinity(p).Match(node)
		if got := matchesAffinity(p, node); got != want {
			t.Errorf("case %d: %v, the library says %v: %s", i, got, want, fmt.Sprint(p.Spec.NodeSelector, p.Spec.Affinity))
		}
	}
	t.Logf("%d cases", len(cases))
}

// requests counts as the scheduler's helper does, sidecars and init
// containers in every order.
func TestRequestsAsTheLibrary(t *testing.T) {
	always := v1.ContainerRestartPolicyAlways
	c := func(cpu, mem string, sidecar bool) v1.Container {
		out := v1.Container{Resources: reqs("cpu", cpu, "memory", mem)}
		if sidecar {
			out.RestartPolicy = &always
		}
		return out
	}
	inits := [][]v1.Container{
		nil,
		{c("1", "1Gi", false)},
		{c("100m", "10Mi", true), c("2", "100Mi", false)},
		{c("2", "100Mi", false), c("300m", "10Mi", true), c("500m", "3Gi", false), c("1", "1Mi", true)},
		{c("100m", "1Mi", true), c("200m", "2Mi", true)},
	}
	apps := [][]v1.Container{{}, {c("250m", "64Mi", false)}, {c("1", "1Gi", false), c("1500m", "10Mi", false)}}
	for i, in := range inits {
		for j, app := range apps {
			for _, overhead := range []v1.ResourceList{nil, {v1.ResourceCPU: resource.MustParse("50m")}} {
				p := &v1.Pod{Spec: v1.PodSpec{InitContainers: in, Containers: app, Overhead: overhead}}
				got, want := requests(p), resourcehelper.PodRequests(p, resourcehelper.PodResourcesOptions{})
				if !equality.Semantic.DeepEqual(got, want) {
					t.Errorf("inits %d, apps %d, overhead %v: %v, the library says %v", i, j, overhead, got, want)
				}
			}
		}
	}
}
