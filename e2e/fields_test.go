package e2e

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// metadata.generation is 1 when the pod appears and one more at a change of
// its spec (an edit that keeps metadata.uid), as the API server counts; the
// status and every condition observe the generation synced, as the kubelet
// v1.37 reports it. Read through kubectl, as a controller would.
func TestGenerationAndObservedGeneration(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	manifest := func(value string) string {
		return `apiVersion: v1
kind: Pod
metadata: {name: gen, uid: 6f1c2a3e-0d4b-4c55-9a7e-2b8f0c1d3e4f}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: busybox:1.36
    env: [{name: V, value: "` + value + `"}]
    command: ["sh", "-c", 'echo "v $V"; ` + untilTerm + `']
`
	}
	n.writeManifest("gen.yaml", manifest("one"))
	p := n.waitPod("gen", "Running", running)
	kc := n.kubeconfig(false)
	generations := func() string {
		out, errOut, err := n.kubectl(kc, "get", "pod", p.Name, "-o",
			`jsonpath={.metadata.generation} {.status.observedGeneration} {range .status.conditions[*]}{.type}={.observedGeneration} {end}`)
		if err != nil {
			t.Fatalf("kubectl get: %v\n%s", err, errOut)
		}
		return strings.TrimSpace(out)
	}
	const gen1 = "1 1 PodReadyToStartContainers=1 Initialized=1 Ready=1 ContainersReady=1 PodScheduled=1"
	if got := generations(); got != gen1 {
		t.Errorf("created: %q, want %q", got, gen1)
	}
	n.writeManifest("gen.yaml", manifest("two"))
	n.waitPod("gen", "the new spec running", func(p *v1.Pod) bool {
		return running(p) && len(p.Spec.Containers) == 1 && p.Spec.Containers[0].Env[0].Value == "two"
	})
	const gen2 = "2 2 PodReadyToStartContainers=2 Initialized=2 Ready=2 ContainersReady=2 PodScheduled=2"
	if got := generations(); got != gen2 {
		t.Errorf("after a spec change: %q, want %q", got, gen2)
	}
}
