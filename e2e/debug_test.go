package e2e

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/internal/apipods"
)

// debugPod has a target whose process is told apart by its arguments.
const debugPod = `apiVersion: v1
kind: Pod
metadata:
  name: dbg
spec:
  terminationGracePeriodSeconds: 1
  volumes:
  - name: scratch
    emptyDir: {}
  containers:
  - name: app
    image: busybox:1.36
    command: ["sh", "-c", "echo from-app > /scratch/mark; exec sleep 3601"]
    volumeMounts:
    - name: scratch
      mountPath: /scratch
  - name: other
    image: busybox:1.36
    command: ["sleep", "3602"]
`

func ephemeralStatus(p *v1.Pod, name string) *v1.ContainerStatus {
	for i := range p.Status.EphemeralContainerStatuses {
		if p.Status.EphemeralContainerStatuses[i].Name == name {
			return &p.Status.EphemeralContainerStatuses[i]
		}
	}
	return nil
}

// kubectl debug -it adds an ephemeral container to a running pod through
// the ephemeralcontainers subresource (a strategic merge patch), waits for
// it to run and attaches: a shell in the pod's network and UTS namespaces
// and, with --target, in the target's PID namespace. It ends with the
// shell and is never restarted; a JSON patch adds another; what the API
// server refuses is refused with its message; the view token may not add
// one. A restarted noderun keeps them, a changed manifest (a new pod) has
// none, and the manifest never changes.
func TestKubectlDebug(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	admin, view := n.kubeconfig(true), n.kubeconfig(false)
	n.writeManifest("dbg.yaml", debugPod)
	n.waitPod("dbg", "Running", running)
	pod := "dbg-" + nodeName
	manifest, err := os.ReadFile(filepath.Join(n.podsDir, "dbg.yaml"))
	if err != nil {
		t.Fatal(err)
	}

	buildKubectl(t) // before the clock starts
	ctx, cancel := context.WithTimeout(context.Background(), 4*waitTimeout)
	defer cancel()
	ptmx, tout, wait := startOnTerminal(t, n.kubectlCmd(ctx, admin, "debug", "-it", "pod/"+pod,
		"--image=busybox:1.36", "--image-pull-policy=Never", "--target=app", "-c", "debugger"), 30, 120)
	defer ptmx.Close()
	defer func() {
		if t.Failed() {
			t.Logf("kubectl debug's terminal: %q", tout.String())
		}
	}()
	waitUntil(t, "the debug shell to answer", func() bool {
		io.WriteString(ptmx, "echo $((6*7))\r")
		return strings.Contains(tout.String(), "42\r\n")
	})
	// The target's processes are its PID namespace's: PID 1 is its sleep.
	waitUntil(t, "the target's process as PID 1", func() bool {
		io.WriteString(ptmx, "tr '\\0' ' ' < /proc/1/cmdline; echo\r")
		return strings.Contains(tout.String(), "sleep 3601 \r\n")
	})
	waitUntil(t, "the target's files through /proc/1/root", func() bool {
		io.WriteString(ptmx, "cat /proc/1/root/scratch/mark\r")
		return strings.Contains(tout.String(), "from-app\r\n")
	})
	waitUntil(t, "the pod's hostname", func() bool {
		io.WriteString(ptmx, "hostname\r")
		return strings.Contains(tout.String(), pod+"\r\n")
	})
	io.WriteString(ptmx, "exit 5\r")
	if code := wait(); code != 0 {
		t.Errorf("kubectl debug -it: exit %d after the shell's exit, %q", code, tout.String())
	}
	p := n.waitPod("dbg", "the debugger terminated", func(p *v1.Pod) bool {
		st := ephemeralStatus(p, "debugger")
		return st != nil && st.State.Terminated != nil
	})
	ended := ephemeralStatus(p, "debugger")
	if ended.State.Terminated.ExitCode != 5 || ended.RestartCount != 0 {
		t.Errorf("the debugger's status %+v: want terminated with 5, no restart", ended)
	}
	if len(p.Spec.EphemeralContainers) != 1 || p.Spec.EphemeralContainers[0].TargetContainerName != "app" {
		t.Errorf("the pod's ephemeral containers: %+v", p.Spec.EphemeralContainers)
	}
	// Its events name it as the kubelet does: spec.ephemeralContainers{debugger}.
	started := false
	for _, ev := range n.events("dbg") {
		switch ev.InvolvedObject.FieldPath {
		case "spec.ephemeralContainers{debugger}":
			started = started || ev.Reason == "Started"
		case "spec.containers{debugger}", "spec.initContainers{debugger}":
			t.Errorf("event %s %q names the debugger as %s", ev.Reason, ev.Message, ev.InvolvedObject.FieldPath)
		}
	}
	if !started {
		t.Errorf("no Started event for spec.ephemeralContainers{debugger} in %+v", n.events("dbg"))
	}
	if o, e, err := n.kubectl(view, "logs", pod, "-c", "debugger"); err != nil || !strings.Contains(o, "42") {
		t.Errorf("kubectl logs of the debugger: %v, %q %s", err, o, e)
	}

	// A JSON patch adds one more, with no target: its own PID namespace
	// ($$$$ is $$ after the $(VAR) expansion the kubelet does).
	if o, e, err := n.kubectl(admin, "patch", "pod", pod, "--subresource=ephemeralcontainers", "--type=json", "-p",
		`[{"op":"add","path":"/spec/ephemeralContainers/-","value":{"name":"once","image":"busybox:1.36","imagePullPolicy":"Never","command":["sh","-c","echo pid $$$$"]}}]`); err != nil {
		t.Fatalf("kubectl patch --type=json: %v, %s %s", err, o, e)
	}
	p = n.waitPod("dbg", "once terminated", func(p *v1.Pod) bool {
		st := ephemeralStatus(p, "once")
		return st != nil && st.State.Terminated != nil
	})
	if o, _, _ := n.kubectl(view, "logs", pod, "-c", "once"); o != "pid 1\n" {
		t.Errorf("logs of the ephemeral container without a target: %q, want its own PID namespace", o)
	}

	// What the API server refuses.
	for _, c := range []struct{ patch, want string }{
		{`{"spec":{"ephemeralContainers":[{"name":"web","image":"busybox:1.36","ports":[{"containerPort":80}]}]}}`,
			`spec.ephemeralContainers[2].ports: Forbidden: cannot be set for an Ephemeral Container`},
		{`{"spec":{"ephemeralContainers":[{"name":"app","image":"busybox:1.36"}]}}`,
			`spec.ephemeralContainers[2].name: duplicate container name "app"`},
		{`{"spec":{"ephemeralContainers":[{"name":"t","image":"busybox:1.36","targetContainerName":"nope"}]}}`,
			`spec.ephemeralContainers[2].targetContainerName: Not found: "nope"`},
		{`{"spec":{"ephemeralContainers":[{"name":"debugger","image":"busybox:1.37"}]}}`,
			`existing ephemeral containers "debugger" may not be changed`},
	} {
		_, e, err := n.kubectl(admin, "patch", "pod", pod, "--subresource=ephemeralcontainers", "-p", c.patch)
		if err == nil || !strings.Contains(e, `The Pod "`+pod+`" is invalid`) || !strings.Contains(e, c.want) {
			t.Errorf("patch %s: %v, %s; want invalid: %s", c.patch, err, e, c.want)
		}
	}
	if _, e, err := n.kubectl(view, "debug", "pod/"+pod, "--image=busybox:1.36", "-c", "viewer"); err == nil || !strings.Contains(e, "forbidden") {
		t.Errorf("kubectl debug with the view token: %v, %s; want forbidden", err, e)
	}

	// A restarted noderun adopts them as they were: nothing restarts.
	n.stop()
	n.start()
	n.waitHealthy()
	p = n.waitPod("dbg", "adopted", func(p *v1.Pod) bool { return len(p.Status.EphemeralContainerStatuses) == 2 })
	for _, name := range []string{"debugger", "once"} {
		st := ephemeralStatus(p, name)
		if st == nil || st.State.Terminated == nil || st.RestartCount != 0 {
			t.Errorf("%s after a noderun restart: %+v, want still terminated", name, st)
		}
	}
	if st := ephemeralStatus(p, "debugger"); st != nil && st.ContainerID != ended.ContainerID {
		t.Errorf("the debugger after a noderun restart is %s, was %s: it ran again", st.ContainerID, ended.ContainerID)
	}
	if b, _ := os.ReadFile(filepath.Join(n.podsDir, "dbg.yaml")); string(b) != string(manifest) {
		t.Errorf("the manifest changed:\n%s", b)
	}

	// A changed manifest is a new pod, without them.
	n.writeManifest("dbg.yaml", strings.Replace(debugPod, "3602", "3603", 1))
	p = n.waitPod("dbg", "replaced and running", func(q *v1.Pod) bool { return q.UID != p.UID && running(q) })
	if len(p.Spec.EphemeralContainers) != 0 || len(p.Status.EphemeralContainerStatuses) != 0 {
		t.Errorf("the replaced pod kept ephemeral containers: %+v", p.Status.EphemeralContainerStatuses)
	}
}

// debuggerPods lists the pods kubectl debug node made.
func (n *node) debuggerPods() []v1.Pod {
	var out []v1.Pod
	for _, p := range n.pods() {
		if strings.HasPrefix(p.Name, "node-debugger-") {
			out = append(out, p)
		}
	}
	return out
}

// kubectl debug node/<node> -it creates a privileged pod in the host's
// namespaces with the host's root at /host, attaches to its shell, and the
// pod is removed once the shell ended (after apipods.Linger, for kubectl's
// fallback to its log). kubectl delete removes one at once. Other pods,
// and the view token, are refused.
func TestKubectlDebugNode(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	admin, view := n.kubeconfig(true), n.kubeconfig(false)
	n.writeManifest("dbg.yaml", debugPod)
	n.waitPod("dbg", "Running", running)

	buildKubectl(t) // before the clock starts
	ctx, cancel := context.WithTimeout(context.Background(), 4*waitTimeout)
	defer cancel()
	ptmx, tout, wait := startOnTerminal(t, n.kubectlCmd(ctx, admin, "debug", "-it", "node/"+nodeName,
		"--image=busybox:1.36", "--image-pull-policy=Never"), 30, 120)
	defer ptmx.Close()
	defer func() {
		if t.Failed() {
			t.Logf("kubectl debug's terminal: %q", tout.String())
		}
	}()
	waitUntil(t, "the node's root at /host", func() bool {
		io.WriteString(ptmx, "ls /host"+n.podsDir+"\r")
		return strings.Contains(tout.String(), "dbg.yaml")
	})
	waitUntil(t, "the host's PID namespace", func() bool {
		io.WriteString(ptmx, "test -e /proc/"+strconv.Itoa(os.Getpid())+" && echo host-pids\r")
		return strings.Contains(tout.String(), "host-pids\r\n")
	})
	dbg := n.debuggerPods()
	if len(dbg) != 1 || !dbg[0].Spec.HostNetwork || !dbg[0].Spec.HostPID || dbg[0].Status.Phase != v1.PodRunning {
		t.Fatalf("debugger pods %+v, want one running in the host's namespaces", dbg)
	}
	io.WriteString(ptmx, "exit\r")
	if code := wait(); code != 0 {
		t.Errorf("kubectl debug node -it: exit %d, %q", code, tout.String())
	}
	waitUntilFor(t, "the ended debugger pod to be removed", 2*apipods.Linger+waitTimeout, func() bool { return len(n.debuggerPods()) == 0 })

	// Without -it it stays until deleted.
	o, e, err := n.kubectl(admin, "debug", "node/"+nodeName, "--image=busybox:1.36", "--image-pull-policy=Never", "--", "sleep", "3600")
	name := strings.Fields(strings.TrimPrefix(o, "Creating debugging pod "))[0]
	if err != nil || !strings.HasPrefix(name, "node-debugger-"+nodeName+"-") {
		t.Fatalf("kubectl debug node: %v, %q %s", err, o, e)
	}
	waitUntil(t, "the debugger pod to run", func() bool {
		d := n.debuggerPods()
		return len(d) == 1 && d[0].Status.Phase == v1.PodRunning
	})
	if o, e, err := n.kubectl(admin, "delete", "pod", name); err != nil || !strings.Contains(o, "deleted") {
		t.Errorf("kubectl delete of the debugger pod: %v, %q %s", err, o, e)
	}
	if d := n.debuggerPods(); len(d) != 0 {
		t.Errorf("after kubectl delete (which waits for it to go): %+v", d)
	}

	// What the API refuses.
	if _, e, err := n.kubectl(admin, "run", "other", "--image=busybox:1.36"); err == nil || !strings.Contains(e, "MethodNotAllowed") || !strings.Contains(e, "only for `kubectl debug node/"+nodeName+"`") {
		t.Errorf("kubectl run: %v, %s; want it refused, naming kubectl debug node", err, e)
	}
	if _, e, err := n.kubectl(admin, "delete", "pod", "dbg-"+nodeName); err == nil || !strings.Contains(e, "manifests") {
		t.Errorf("kubectl delete of a static pod: %v, %s; want it refused", err, e)
	}
	if _, e, err := n.kubectl(view, "debug", "node/"+nodeName, "--image=busybox:1.36"); err == nil || !strings.Contains(e, "forbidden") {
		t.Errorf("kubectl debug node with the view token: %v, %s; want forbidden", err, e)
	}
}

// waitUntilFor is waitUntil with a bound of its own, where the bound is
// the behaviour (a linger of noderun's).
func waitUntilFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting until %s", timeout, what)
		}
		time.Sleep(pollEvery)
	}
}
