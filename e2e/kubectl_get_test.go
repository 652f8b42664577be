package e2e

import (
	"bufio"
	"context"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// kubectlOK runs kubectl and fails the test unless it succeeds.
func (n *node) kubectlOK(kubeconfig string, args ...string) string {
	n.t.Helper()
	out, errOut, err := n.kubectl(kubeconfig, args...)
	if err != nil {
		n.t.Fatalf("kubectl %s: %v\n%s%s", strings.Join(args, " "), err, out, errOut)
	}
	return out
}

// podRow finds a pod's row in kubectl's table output, split in columns.
func podRow(out, name string) []string {
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == name {
			return f
		}
	}
	return nil
}

// idlePod runs until it is told to stop; the kubectl tests read it.
const idlePod = `apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: web}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", '` + untilTerm + `']
`

// `kubectl get pods` shows the usual columns with the values a cluster
// shows: READY, STATUS (CrashLoopBackOff, Init:0/1), RESTARTS with when.
func TestKubectlGetPods(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("web.yaml", idlePod)
	n.writeManifest("crash.yaml", `apiVersion: v1
kind: Pod
metadata:
  name: crash
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: crash
    image: busybox:1.36
    command: ["sh", "-c", "exit 3"]
`)
	n.writeManifest("init.yaml", `apiVersion: v1
kind: Pod
metadata:
  name: init
spec:
  terminationGracePeriodSeconds: 2
  initContainers:
  - name: wait
    image: busybox:1.36
    command: ["sh", "-c", '`+untilTerm+`']
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", '`+untilTerm+`']
`)
	n.waitPod("web", "Running", running)
	n.waitPod("crash", "in CrashLoopBackOff", func(p *v1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return len(cs) == 1 && cs[0].RestartCount >= 1 && cs[0].State.Waiting != nil && cs[0].State.Waiting.Reason == "CrashLoopBackOff"
	})
	n.waitPod("init", "init container running", func(p *v1.Pod) bool {
		cs := p.Status.InitContainerStatuses
		return len(cs) == 1 && cs[0].State.Running != nil
	})
	view := n.kubeconfig(false)

	out := n.kubectlOK(view, "get", "pods")
	if header := strings.Fields(strings.SplitN(out, "\n", 2)[0]); strings.Join(header, " ") != "NAME READY STATUS RESTARTS AGE" {
		t.Errorf("header %q, want NAME READY STATUS RESTARTS AGE\n%s", header, out)
	}
	age := regexp.MustCompile(`^[0-9]+[smhd]`)
	web := podRow(out, "web-e2e")
	if len(web) != 5 || web[1] != "1/1" || web[2] != "Running" || web[3] != "0" || !age.MatchString(web[4]) {
		t.Errorf("web row %q, want web-e2e 1/1 Running 0 AGE\n%s", web, out)
	}
	// The STATUS and RESTARTS a cluster shows for a crash-looping pod:
	// CrashLoopBackOff and "N (Xs ago)".
	crash := podRow(out, "crash-e2e")
	if len(crash) != 7 || crash[1] != "0/1" || crash[2] != "CrashLoopBackOff" ||
		!regexp.MustCompile(`^\([0-9]+[smh]$`).MatchString(crash[4]) || crash[5] != "ago)" {
		t.Errorf("crash row %q, want crash-e2e 0/1 CrashLoopBackOff N (Xs ago) AGE\n%s", crash, out)
	}
	if init := podRow(out, "init-e2e"); len(init) != 5 || init[1] != "0/1" || init[2] != "Init:0/1" {
		t.Errorf("init row %q, want init-e2e 0/1 Init:0/1 0 AGE\n%s", init, out)
	}

	wide := n.kubectlOK(view, "get", "pods", "-o", "wide", "-l", "app=web")
	header := strings.Join(strings.Fields(strings.SplitN(wide, "\n", 2)[0]), " ")
	if header != "NAME READY STATUS RESTARTS AGE IP NODE NOMINATED NODE READINESS GATES" {
		t.Errorf("-o wide header %q\n%s", header, wide)
	}
	p := n.pod("web")
	if row := podRow(wide, "web-e2e"); len(row) != 9 || row[5] != p.Status.PodIP || row[6] != nodeName || row[7] != "<none>" || row[8] != "<none>" {
		t.Errorf("-o wide row %q, want IP %s NODE %s <none> <none>\n%s", row, p.Status.PodIP, nodeName, wide)
	}
	if podRow(wide, "crash-e2e") != nil {
		t.Errorf("label selector app=web listed crash-e2e:\n%s", wide)
	}

	all := n.kubectlOK(view, "get", "pods", "-A", "--field-selector", "status.phase=Running")
	if row := podRow(all, "default"); row == nil || !strings.Contains(all, "web-e2e") {
		t.Errorf("get pods -A --field-selector status.phase=Running:\n%s", all)
	}
	if name := n.kubectlOK(view, "get", "pod", "web-e2e", "-o", "jsonpath={.metadata.name} {.status.phase} {.spec.nodeName}"); name != "web-e2e Running "+nodeName {
		t.Errorf("jsonpath: %q", name)
	}
	_, errOut, err := n.kubectl(view, "get", "pod", "nope")
	if err == nil || !strings.Contains(errOut, `pods "nope" not found`) {
		t.Errorf("get pod nope: %v %s", err, errOut)
	}
	_, errOut, err = n.kubectl(n.kubeconfig(true), "delete", "pod", "web-e2e")
	if err == nil || !strings.Contains(errOut, "manifests") {
		t.Errorf("delete pod: %v %s, want a refusal naming manifests", err, errOut)
	}
}

// `kubectl get pods -w` sees a pod from its manifest to its removal:
// Pending, Running, Terminating, then gone.
func TestKubectlWatchPods(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	view := n.kubeconfig(false)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	buildKubectl(t)
	cmd := n.kubectlCmd(ctx, view, "get", "pods", "-w", "--output-watch-events")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); _ = cmd.Wait() }()
	lines := make(chan string, 100)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	// The watch goes on from the list's resourceVersion once kubectl has
	// listed, which it does not say while there is nothing: a marker pod
	// shows when it has, however long kubectl takes to start on a busy
	// machine. Only then is the pod added, so its Pending is watched.
	n.writeManifest("marker.yaml", strings.ReplaceAll(idlePod, "name: web", "name: marker"))
	var seen []string
	listed := time.After(waitTimeout)
	for !slices.ContainsFunc(seen, func(l string) bool { return strings.Contains(l, "marker-e2e") }) {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("kubectl get -w ended; saw %q", seen)
			}
			seen = append(seen, line)
		case <-listed:
			t.Fatalf("kubectl get -w never showed the marker pod; printed:\n%s", strings.Join(seen, "\n"))
		}
	}
	n.writeManifest("w.yaml", `apiVersion: v1
kind: Pod
metadata:
  name: w
spec:
  terminationGracePeriodSeconds: 3
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", '`+untilTerm+`']
`)
	want := []string{"Pending", "Running", "Terminating", "DELETED"}
	deadline := time.After(waitTimeout + 10*time.Second)
	removed := false
	for len(want) > 0 {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("kubectl get -w ended; saw %q", seen)
			}
			seen = append(seen, line)
			f := strings.Fields(line)
			if len(f) < 4 || f[1] != "w-e2e" {
				continue
			}
			status := f[3]
			if f[0] == "DELETED" {
				status = "DELETED"
			}
			if status == "ContainerCreating" {
				status = "Pending" // the phase kubectl shows while images and sandbox are set up
			}
			if status == want[0] {
				want = want[1:]
			}
			if status == "Running" && !removed {
				removed = true
				n.removeManifest("w.yaml")
			}
		case <-deadline:
			t.Fatalf("still waiting for %q; kubectl printed:\n%s", want, strings.Join(seen, "\n"))
		}
	}
	t.Logf("kubectl get -w printed:\n%s", strings.Join(seen, "\n"))
}

// `kubectl describe pod` shows the pod's events; `get events` lists them.
func TestKubectlDescribeAndEvents(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("web.yaml", idlePod)
	n.waitPod("web", "Running", running)
	view := n.kubeconfig(false)
	out := n.kubectlOK(view, "describe", "pod", "web-e2e")
	for _, want := range []string{"Name:", "web-e2e", "Node:", nodeName, "Status:", "Running", "Events:", "Created", "Started", "Created container main"} {
		if !strings.Contains(out, want) {
			t.Errorf("describe pod lacks %q:\n%s", want, out)
		}
	}
	// The same without kubectl.
	own, err := exec.Command(noderunBin, "--state-dir", n.state, "--run-dir", n.run, "describe", "web-e2e").CombinedOutput()
	for _, want := range []string{"Name:", "web-e2e", "Status:", "Running", "Containers:", "Restart Count:", "Events:", "Started", "Created container main"} {
		if err != nil || !strings.Contains(string(own), want) {
			t.Errorf("noderun describe lacks %q (%v):\n%s", want, err, own)
		}
	}
	own, err = exec.Command(noderunBin, "--state-dir", n.state, "--run-dir", n.run, "events", "--for", "web-e2e").CombinedOutput()
	if err != nil || !strings.Contains(string(own), "LAST SEEN") || !strings.Contains(string(own), "pod/web-e2e") {
		t.Errorf("noderun events: %v\n%s", err, own)
	}

	ev := n.kubectlOK(view, "get", "events")
	header := strings.Join(strings.Fields(strings.SplitN(ev, "\n", 2)[0]), " ")
	if header != "LAST SEEN TYPE REASON OBJECT MESSAGE" || !strings.Contains(ev, "pod/web-e2e") || !strings.Contains(ev, "Started") {
		t.Errorf("get events:\n%s", ev)
	}
}

// `kubectl get nodes` and `describe node` show this node.
func TestKubectlNodes(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	view := n.kubeconfig(false)
	out := n.kubectlOK(view, "get", "nodes")
	row := podRow(out, nodeName)
	if len(row) != 5 || row[1] != "Ready" || row[2] != "<none>" || !strings.HasPrefix(row[4], "v") {
		t.Errorf("get nodes row %q\n%s", row, out)
	}
	out = n.kubectlOK(view, "describe", "node", nodeName)
	for _, want := range []string{"Conditions:", "MemoryPressure", "KubeletReady", "Capacity:", "ephemeral-storage:", "Allocatable:",
		"System Info:", "Boot ID:", "Container Runtime Version:  containerd://", "Kubelet Version:", "InternalIP:"} {
		if !strings.Contains(out, want) {
			t.Errorf("describe node lacks %q:\n%s", want, out)
		}
	}
}
