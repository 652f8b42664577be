package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
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

// fileKeyRef (KEP-3721, beta and on in v1.37): an init container writes an
// env file into an emptyDir and the app container starts with its values;
// a key the file lacks keeps the container waiting with the kubelet's
// CreateContainerConfigError, an optional one is left unset.
func TestFileKeyRefEnv(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	pod := func(name, key string) string {
		return `apiVersion: v1
kind: Pod
metadata: {name: ` + name + `}
spec:
  terminationGracePeriodSeconds: 2
  volumes: [{name: cfg, emptyDir: {}}]
  initContainers:
  - name: write
    image: busybox:1.36
    volumeMounts: [{name: cfg, mountPath: /cfg}]
    command: ["sh", "-c", "printf \"# made by init\\nGREETING='hello world' # a comment\\nLINES='one\\ntwo'\\n\" > /cfg/app.env"]
  containers:
  - name: main
    image: busybox:1.36
    env:
    - {name: GREETING, valueFrom: {fileKeyRef: {volumeName: cfg, path: app.env, key: ` + key + `}}}
    - {name: LINES, valueFrom: {fileKeyRef: {volumeName: cfg, path: app.env, key: LINES}}}
    - {name: MAYBE, valueFrom: {fileKeyRef: {volumeName: cfg, path: app.env, key: NOPE, optional: true}}}
    command: ["sh", "-c", 'echo "greeting $GREETING"; echo "lines $(echo "$LINES" | tr "\n" ,)"; echo "maybe ${MAYBE-unset}"; ` + untilTerm + `']
`
	}
	n.writeManifest("envfile.yaml", pod("envfile", "GREETING"))
	n.writeManifest("nokey.yaml", pod("nokey", "MISSING"))
	p := n.waitPod("envfile", "Running", running)
	log := n.logPath(p, "main", 0)
	n.waitLogLine(log, "greeting hello world")
	n.waitLogLine(log, "lines one,two,")
	n.waitLogLine(log, "maybe unset")

	q := n.waitPod("nokey", "CreateContainerConfigError", func(p *v1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return len(cs) == 1 && cs[0].State.Waiting != nil && cs[0].State.Waiting.Reason == "CreateContainerConfigError"
	})
	msg := q.Status.ContainerStatuses[0].State.Waiting.Message
	if !strings.HasPrefix(msg, `environment variable key "MISSING" not found in file "`) || !strings.HasSuffix(msg, `/cfg/app.env"`) {
		t.Errorf("waiting message %q, want the kubelet's", msg)
	}
}

// recursiveReadOnly: Enabled (runc's rro; this host's runc lists it and its
// kernel has mount_setattr) makes a mount below the volume read-only too,
// where a plain readOnly mount leaves it writable; the container status
// says which mount is which, as the kubelet v1.37 reports it.
func TestRecursiveReadOnlyMount(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	dir := filepath.Join(n.root, "rro-volume")
	sub := filepath.Join(dir, "sub")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", sub, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(sub, unix.MNT_DETACH) })
	n.writeManifest("rro.yaml", `apiVersion: v1
kind: Pod
metadata: {name: rro}
spec:
  terminationGracePeriodSeconds: 2
  volumes: [{name: v, hostPath: {path: `+dir+`}}]
  containers:
  - name: main
    image: busybox:1.36
    volumeMounts:
    - {name: v, mountPath: /rro, readOnly: true, recursiveReadOnly: Enabled}
    - {name: v, mountPath: /ro, readOnly: true}
    command: ["sh", "-c", 'for d in rro ro; do touch /$d/top 2>/dev/null && echo "$d top writable" || echo "$d top read-only"; touch /$d/sub/x 2>/dev/null && echo "$d sub writable" || echo "$d sub read-only"; done; `+untilTerm+`']
`)
	p := n.waitPod("rro", "Running", running)
	log := n.logPath(p, "main", 0)
	for _, want := range []string{"rro top read-only", "rro sub read-only", "ro top read-only", "ro sub writable"} {
		n.waitLogLine(log, want)
	}
	var got []string
	for _, m := range p.Status.ContainerStatuses[0].VolumeMounts {
		mode := "<nil>"
		if m.RecursiveReadOnly != nil {
			mode = string(*m.RecursiveReadOnly)
		}
		got = append(got, m.MountPath+" "+mode)
	}
	if strings.Join(got, ", ") != "/rro Enabled, /ro Disabled" {
		t.Errorf("status volumeMounts: %v, want /rro Enabled, /ro Disabled", got)
	}
}

// A static pod's deprecated AppArmor annotation still applies to its
// container in v1.37 (the kubelet's GetProfile falls back to it; nothing
// copies it to the field): on this host, which has no AppArmor, a localhost
// profile has the pod rejected as the kubelet's AppArmor admission does,
// unconfined runs; noderun check warns of both, as the API server does.
func TestAppArmorAnnotationOnStaticPod(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	if _, err := os.Stat("/sys/kernel/security/apparmor"); err == nil {
		t.Skip("this host has AppArmor; the test shows the annotation by the refusal of a host without it")
	}
	pod := func(name, profile string) string {
		return `apiVersion: v1
kind: Pod
metadata:
  name: ` + name + `
  annotations: {container.apparmor.security.beta.kubernetes.io/main: "` + profile + `"}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", '` + untilTerm + `']
`
	}
	n.writeManifest("aa-local.yaml", pod("aa-local", "localhost/noderun-test"))
	n.writeManifest("aa-unconfined.yaml", pod("aa-unconfined", "unconfined"))
	n.waitPod("aa-unconfined", "Running", running)
	q := n.waitPod("aa-local", "Failed", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodFailed })
	if q.Status.Reason != "AppArmor" || q.Status.Message != "Pod was rejected: Cannot enforce AppArmor: AppArmor is not enabled on the host" {
		t.Errorf("rejected with %q: %q, want the kubelet's AppArmor admission", q.Status.Reason, q.Status.Message)
	}
	out, err := exec.Command(noderunBin, "check", n.podsDir).CombinedOutput()
	if err != nil {
		t.Fatalf("noderun check: %v\n%s", err, out)
	}
	const warn = `metadata.annotations[container.apparmor.security.beta.kubernetes.io/main]: deprecated since v1.30; use the "appArmorProfile" field instead`
	if strings.Count(string(out), warn) != 2 {
		t.Errorf("noderun check does not warn of both annotations:\n%s", out)
	}
}
