package e2e

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
)

// mirrorManifest is a static pod in kube-system, as kubeadm's are; tag
// makes an edited version.
func mirrorManifest(name, tag string) string {
	return `apiVersion: v1
kind: Pod
metadata:
  name: ` + name + `
  namespace: kube-system
  labels: {tier: control-plane}
spec:
  priorityClassName: system-node-critical
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: busybox:1.36
    env: [{name: TAG, value: "` + tag + `"}]
    command: ["sh", "-c", '` + untilTerm + `']
`
}

// kubeGet runs the real kubectl get -o json with kubeconfig into v; it
// reports whether the object exists.
func kubeGet(t *testing.T, n *node, kubeconfig string, v any, args ...string) bool {
	t.Helper()
	out, errOut, err := n.kubectl(kubeconfig, append([]string{"get", "-o", "json"}, args...)...)
	if err != nil {
		if strings.Contains(errOut, "NotFound") {
			return false
		}
		t.Fatalf("kubectl get %s: %v\n%s", strings.Join(args, " "), err, errOut)
	}
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatal(err)
	}
	return true
}

// waitAPI polls the API server through kubectl until cond holds.
func waitAPI(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", timeout, what)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// mirrorPod returns the API server's mirror pod of a static pod, nil if
// there is none.
func (a *apiServer) mirrorPod(n *node, name string) *v1.Pod {
	var p v1.Pod
	if !kubeGet(a.t, n, a.admin, &p, "-n", "kube-system", "pod", name+"-"+nodeName) {
		return nil
	}
	return &p
}

// TestMirrorModeAgainstAPIServer: with --kubeconfig, noderun registers its
// Node in a real kube-apiserver (Node authorizer, NodeRestriction: the
// kubelet's credentials and limits), renews its Lease, keeps a mirror pod
// per static pod with the kubelet's annotations, owner and status, brings
// a deleted one back, replaces it when the manifest changes, removes it
// with its manifest (while noderun was down too: orphans at start), and
// runs pods while the API server is down, catching up after.
func TestMirrorModeAgainstAPIServer(t *testing.T) {
	version, _ := controlPlaneVersions(t)
	api := startAPIServer(t, version, nodeName)
	n := newNode(t, "--kubeconfig", api.nodeKubeconfig(nodeName))
	n.writeManifest("cp.yaml", mirrorManifest("cp", "1"))
	local := n.waitPod("cp", "Running", running)

	var node v1.Node
	waitAPI(t, "node registered and Ready", 2*time.Minute, func() bool {
		return kubeGet(t, n, api.admin, &node, "node", nodeName) && nodeReady(&node)
	})
	if node.Labels["kubernetes.io/hostname"] != nodeName || node.Labels["kubernetes.io/os"] != "linux" || node.Status.NodeInfo.KubeletVersion == "" {
		t.Errorf("node labels %v, nodeInfo %+v", node.Labels, node.Status.NodeInfo)
	}
	var lease coordv1.Lease
	kubeGet(t, n, api.admin, &lease, "-n", "kube-node-lease", "lease", nodeName)
	first := lease.Spec.RenewTime.Time
	if *lease.Spec.LeaseDurationSeconds != 40 || *lease.Spec.HolderIdentity != nodeName || lease.OwnerReferences[0].UID != node.UID {
		t.Errorf("lease %+v", lease)
	}
	waitAPI(t, "lease renewed", time.Minute, func() bool {
		kubeGet(t, n, api.admin, &lease, "-n", "kube-node-lease", "lease", nodeName)
		return lease.Spec.RenewTime.After(first)
	})
	t.Logf("lease renewed after %s", lease.Spec.RenewTime.Sub(first).Round(time.Second))

	hash := local.Annotations["kubernetes.io/config.hash"]
	var mp *v1.Pod
	waitAPI(t, "mirror pod Running", time.Minute, func() bool {
		mp = api.mirrorPod(n, "cp")
		return mp != nil && mp.Status.Phase == v1.PodRunning && len(mp.Status.ContainerStatuses) == 1 && mp.Status.ContainerStatuses[0].Ready
	})
	if mp.Annotations["kubernetes.io/config.mirror"] != hash || mp.Annotations["kubernetes.io/config.hash"] != hash ||
		mp.Annotations["kubernetes.io/config.source"] != "file" || mp.Annotations["kubernetes.io/config.seen"] == "" ||
		len(mp.OwnerReferences) != 1 || mp.OwnerReferences[0].Kind != "Node" || mp.OwnerReferences[0].UID != node.UID ||
		mp.Status.PodIP != local.Status.PodIP || mp.Spec.NodeName != nodeName {
		t.Errorf("mirror pod: %+v\nstatus %+v", mp.ObjectMeta, mp.Status)
	}
	t.Log(n.kubectlOK(api.admin, "-n", "kube-system", "get", "pods", "-o", "wide"))

	// kubectl delete (graceful, as a user deletes): it comes back.
	n.kubectlOK(api.admin, "-n", "kube-system", "delete", "pod", "cp-"+nodeName, "--wait=false")
	waitAPI(t, "deleted mirror pod back", time.Minute, func() bool {
		p := api.mirrorPod(n, "cp")
		return p != nil && p.UID != mp.UID && p.DeletionTimestamp == nil && p.Status.Phase == v1.PodRunning
	})

	// An edit: the mirror pod follows the new hash.
	n.writeManifest("cp.yaml", mirrorManifest("cp", "2"))
	edited := n.waitPod("cp", "edited", func(p *v1.Pod) bool {
		return p.Annotations["kubernetes.io/config.hash"] != hash && running(p)
	})
	waitAPI(t, "mirror pod of the edited manifest", time.Minute, func() bool {
		p := api.mirrorPod(n, "cp")
		return p != nil && p.Annotations["kubernetes.io/config.mirror"] == edited.Annotations["kubernetes.io/config.hash"] && p.Status.Phase == v1.PodRunning
	})

	// The API server goes down: pods start all the same, failures are
	// counted and recorded as events; the mirror catches up after.
	api.stop()
	n.writeManifest("offline.yaml", mirrorManifest("offline", "1"))
	n.waitPod("offline", "Running", running)
	// The mirror's next turn (a second after the pod changed, or its
	// 10 s tick) finds the server gone: waited for, not assumed done.
	waitAPI(t, "a failed mirror call counted on /metrics", time.Minute, func() bool {
		metrics := n.kubectlOK(n.kubeconfig(false), "get", "--raw", "/metrics")
		return strings.Contains(grepLines(metrics, "noderun_mirror_requests_total{"), `result="failure"`)
	})
	waitAPI(t, "a FailedMirror event", time.Minute, func() bool {
		return strings.Contains(n.kubectlOK(n.kubeconfig(false), "get", "events"), "FailedMirror")
	})
	api.start()
	waitAPI(t, "mirror pod made once the API server is back", 2*time.Minute, func() bool {
		p := api.mirrorPod(n, "offline")
		return p != nil && p.Status.Phase == v1.PodRunning
	})

	// Removed while noderun is down: the orphan goes at the next start.
	n.stop()
	n.removeManifest("offline.yaml")
	n.start()
	waitAPI(t, "orphaned mirror pod deleted at start", time.Minute, func() bool { return api.mirrorPod(n, "offline") == nil })
	// Removed while it runs.
	n.removeManifest("cp.yaml")
	waitAPI(t, "mirror pod of a removed manifest deleted", time.Minute, func() bool { return api.mirrorPod(n, "cp") == nil })
}

func nodeReady(n *v1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == v1.NodeReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}
