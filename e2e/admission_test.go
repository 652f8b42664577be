package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// admissionPod is a pod that idles, with spec lines (indented two spaces)
// added before its containers.
func admissionPod(name, spec, container string) string {
	return `apiVersion: v1
kind: Pod
metadata:
  name: ` + name + `
spec:
  terminationGracePeriodSeconds: 2
` + spec + `  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", '` + untilTerm + `']
` + container
}

// rejected waits for the pod's Failed status with the kubelet's reason
// and message and checks that nothing of it ever ran: no container in
// containerd, no container status, and no event but the rejection.
func (n *node) rejected(name, reason, msg string) *v1.Pod {
	n.t.Helper()
	p := n.waitPod(name, "rejected with "+reason, func(p *v1.Pod) bool {
		return p.Status.Phase == v1.PodFailed && p.Status.Reason == reason
	})
	if p.Status.Message != "Pod was rejected: "+msg || len(p.Status.ContainerStatuses) != 0 || p.Status.PodIP != "" {
		n.t.Errorf("%s: status %s, want message %q, no container status and no IP", name, statusJSON(p), "Pod was rejected: "+msg)
	}
	if cs := n.containers(string(p.UID)); len(cs) != 0 {
		n.t.Errorf("%s: containerd holds %d containers of a rejected pod", name, len(cs))
	}
	evs := n.events(name)
	if !hasEvent(evs, reason, msg) || slices.ContainsFunc(evs, func(ev v1.Event) bool { return ev.Reason != reason }) {
		n.t.Errorf("%s: events %+v, want only %s %q", name, evs, reason, msg)
	}
	return p
}

// A pod whose nodeSelector the node's labels do not match is rejected as
// the kubelet rejects it, before anything of it runs; it stays so across a
// noderun restart and runs once its manifest is fixed. The node shows its
// --node-labels beside the well-known ones.
func TestAdmissionNodeSelector(t *testing.T) {
	t.Parallel()
	n := newNode(t, "--node-labels", "disk=ssd,example.com/tier=edge")
	n.writeManifest("match.yaml", admissionPod("match", "  nodeSelector: {disk: ssd, kubernetes.io/hostname: "+nodeName+"}\n", ""))
	n.writeManifest("other.yaml", admissionPod("other", "  nodeSelector: {disk: hdd}\n", ""))
	n.waitPod("match", "Running", running)
	const msg = "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector"
	old := n.rejected("other", "NodeAffinity", msg)

	view := n.kubeconfig(false)
	out := n.kubectlOK(view, "get", "pods")
	if row := podRow(out, "other-"+nodeName); len(row) != 5 || row[1] != "0/1" || row[2] != "NodeAffinity" || row[3] != "0" {
		t.Errorf("kubectl get pods row %q, want other-%s 0/1 NodeAffinity 0 AGE\n%s", row, nodeName, out)
	}
	if desc := n.kubectlOK(view, "describe", "pod", "other-"+nodeName); !strings.Contains(desc, "Pod was rejected: "+msg) {
		t.Errorf("kubectl describe lacks the message:\n%s", desc)
	}
	pods, err := n.runBounded(exec.Command(noderunBin, "--run-dir", n.run, "--state-dir", n.state, "pods"), waitTimeout)
	if err != nil || !strings.Contains(pods, "NodeAffinity") {
		t.Errorf("noderun pods: %v\n%s", err, pods)
	}
	labels := n.kubectlOK(view, "get", "node", "--show-labels")
	for _, want := range []string{"disk=ssd", "example.com/tier=edge", "kubernetes.io/hostname=" + nodeName, "kubernetes.io/os=linux",
		"kubernetes.io/arch=" + runtime.GOARCH, "beta.kubernetes.io/os=linux", "beta.kubernetes.io/arch=" + runtime.GOARCH} {
		if !strings.Contains(labels, want) {
			t.Errorf("kubectl get node --show-labels lacks %s:\n%s", want, labels)
		}
	}

	n.stop()
	n.start()
	n.waitHealthy()
	again := n.rejected("other", "NodeAffinity", msg)
	if again.UID != old.UID {
		t.Errorf("UID %s after the restart, was %s", again.UID, old.UID)
	}

	n.writeManifest("other.yaml", admissionPod("other", "  nodeSelector: {disk: ssd}\n", ""))
	fixed := n.waitPod("other", "running once its manifest matches", running)
	if fixed.UID == old.UID {
		t.Errorf("the fixed manifest kept UID %s", fixed.UID)
	}
	if cs := n.containers(string(old.UID)); len(cs) != 0 {
		t.Errorf("the rejected version has %d containers", len(cs))
	}
}

// Requests are admitted against the node's allocatable beside the pods
// admitted before (OutOfcpu), and hostPorts against theirs (NodePorts).
func TestAdmissionResourcesAndPorts(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	capacity := runtime.NumCPU() * 1000
	first := fmt.Sprintf("    resources: {requests: {cpu: %dm}}\n    ports: [{containerPort: 80, hostPort: 30777}]\n", capacity-500)
	n.writeManifest("big.yaml", admissionPod("big", "", first))
	n.waitPod("big", "Running", running)

	n.writeManifest("more.yaml", admissionPod("more", "", "    resources: {requests: {cpu: 1}}\n"))
	n.rejected("more", "OutOfcpu",
		fmt.Sprintf("Node didn't have enough resource: cpu, requested: 1000, used: %d, capacity: %d", capacity-500, capacity))
	n.writeManifest("port.yaml", admissionPod("port", "", "    ports: [{containerPort: 8080, hostPort: 30777}]\n"))
	n.rejected("port", "NodePorts", "Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports")
	// An extended resource no device plugin offers is admitted, as by the
	// kubelet, and the pod runs.
	n.writeManifest("device.yaml", admissionPod("device", "", "    resources: {limits: {example.com/foo: 1}}\n"))
	n.waitPod("device", "Running", running)

	out := n.kubectlOK(n.kubeconfig(false), "get", "pods")
	for name, status := range map[string]string{"more": "OutOfcpu", "port": "NodePorts", "big": "Running"} {
		if row := podRow(out, name+"-"+nodeName); len(row) < 3 || row[2] != status {
			t.Errorf("kubectl get pods row %q, want STATUS %s\n%s", row, status, out)
		}
	}
}

// A pod for another OS (spec.os.name) is rejected at admission, as the
// kubelet's predicate handler does, not refused with its manifest.
func TestAdmissionPodOS(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("win.yaml", admissionPod("win", "  os: {name: windows}\n", ""))
	n.writeManifest("lin.yaml", admissionPod("lin", "  os: {name: linux}\n", ""))
	n.waitPod("lin", "Running", running)
	n.rejected("win", "PodOSNotSupported", "Failed to admit pod as the OS field doesn't match node OS")
	out := n.kubectlOK(n.kubeconfig(false), "get", "pods")
	if row := podRow(out, "win-"+nodeName); len(row) != 5 || row[2] != "PodOSNotSupported" {
		t.Errorf("kubectl get pods row %q, want STATUS PodOSNotSupported\n%s", row, out)
	}
}

// On a host without AppArmor, a pod asking for a profile (its field, a
// container's, or the legacy annotation) is rejected at admission with the
// kubelet's reason and message; an Unconfined one runs.
func TestAdmissionAppArmor(t *testing.T) {
	t.Parallel()
	if b, _ := os.ReadFile("/sys/module/apparmor/parameters/enabled"); strings.HasPrefix(string(b), "Y") {
		t.Skip("this host has AppArmor; admission there is unit-tested (admission.TestAppArmor)")
	}
	n := newNode(t)
	n.writeManifest("pod-field.yaml", admissionPod("pod-field", "  securityContext: {appArmorProfile: {type: RuntimeDefault}}\n", ""))
	n.writeManifest("container-field.yaml", admissionPod("container-field", "",
		"    securityContext: {appArmorProfile: {type: Localhost, localhostProfile: k8s-deny-write}}\n"))
	n.writeManifest("annotation.yaml", strings.Replace(admissionPod("annotation", "", ""), "\nspec:",
		"\n  annotations: {container.apparmor.security.beta.kubernetes.io/main: localhost/k8s-deny-write}\nspec:", 1))
	n.writeManifest("unconfined.yaml", admissionPod("unconfined", "  securityContext: {appArmorProfile: {type: Unconfined}}\n", ""))
	n.waitPod("unconfined", "Running", running)
	const msg = "Cannot enforce AppArmor: AppArmor is not enabled on the host"
	for _, name := range []string{"pod-field", "container-field", "annotation"} {
		n.rejected(name, "AppArmor", msg)
	}
}
