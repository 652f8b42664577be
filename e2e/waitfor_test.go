package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// waitForPod is admissionPod with metadata lines (indented two spaces).
func waitForPod(name, meta, container string) string {
	return strings.Replace(admissionPod(name, "", container), "spec:\n", meta+"spec:\n", 1)
}

func podReadySince(p *v1.Pod) time.Time {
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodReady && c.Status == v1.ConditionTrue {
			return c.LastTransitionTime.Time
		}
	}
	return time.Time{}
}

// A pod that waits for another starts only once that one is Ready: until
// then it has no container, shows WaitingForDependencies in kubectl and
// events, and `kubectl wait --for=condition=Ready` on it returns once it is
// Ready. Times come from noderun's status (the dependency's Ready
// transition) and containerd (the dependent's start).
func TestWaitForReady(t *testing.T) {
	t.Parallel()
	buildKubectl(t) // before the clocks start
	n := newNode(t)
	view := n.kubeconfig(false)
	// db gets Ready 3s after it starts at the earliest.
	n.writeManifest("db.yaml", waitForPod("db", "", `    readinessProbe:
      exec: {command: ["true"]}
      initialDelaySeconds: 3
      periodSeconds: 1
`))
	n.writeManifest("web.yaml", waitForPod("web", "  annotations:\n    noderun.dev/wait-for: db-"+nodeName+"\n", ""))
	web := n.waitPod("web", "waiting for db", func(p *v1.Pod) bool { return p.Status.Reason == "WaitingForDependencies" })
	if msg := web.Status.Message; !strings.HasPrefix(msg, "db-"+nodeName+" not Ready") || len(n.containers(string(web.UID))) != 0 {
		t.Errorf("web waits with message %q and %d containers; want db-%s not Ready and none", msg, len(n.containers(string(web.UID))), nodeName)
	}
	// kubectl wait watches the one pod (fieldSelector metadata.name) until
	// its Ready condition is True.
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitTimeout)
	defer cancel()
	kw := n.kubectlCmd(ctx, view, "wait", "--for=condition=Ready", "pod/web-"+nodeName, "--timeout=2m")
	var kwOut strings.Builder
	kw.Stdout, kw.Stderr = &kwOut, &kwOut
	if err := kw.Start(); err != nil {
		t.Fatal(err)
	}
	// While web still waits (db takes 3s), kubectl get and noderun pods
	// show why.
	row := podRow(n.kubectlOK(view, "get", "pods"), "web-"+nodeName)
	pods, err := n.runBounded(exec.Command(noderunBin, "--run-dir", n.run, "--state-dir", n.state, "pods"), waitTimeout)
	if n.pod("web").Status.Reason == "WaitingForDependencies" &&
		(len(row) != 5 || row[2] != "WaitingForDependencies" || err != nil || !strings.Contains(pods, "WaitingForDependencies")) {
		t.Errorf("kubectl get pods row %q, noderun pods (%v):\n%s\nwant WaitingForDependencies in both", row, err, pods)
	}
	if err := kw.Wait(); err != nil || !strings.Contains(kwOut.String(), "condition met") {
		t.Fatalf("kubectl wait: %v\n%s", err, kwOut.String())
	}
	web = n.waitPod("web", "Ready", func(p *v1.Pod) bool { return !podReadySince(p).IsZero() })
	db := n.pod("db")
	dbReady := podReadySince(db)
	dbStarted := containerStatus(db, "main").State.Running.StartedAt.Time
	webStarted := containerStatus(web, "main").State.Running.StartedAt.Time
	// API times have whole seconds: web started in or after db's Ready
	// second, and db was Ready no sooner than its probe's 3s delay allowed.
	if webStarted.Before(dbReady) || dbReady.Before(dbStarted.Add(2*time.Second)) {
		t.Errorf("db started %s, Ready %s; web started %s: web must start after db is Ready", dbStarted, dbReady, webStarted)
	}
	if evs := n.events("web"); !hasEvent(evs, "WaitingForDependencies", "db-"+nodeName+" not Ready") {
		t.Errorf("web's events lack WaitingForDependencies: %+v", evs)
	}
	if desc := n.kubectlOK(view, "describe", "pod", "web-"+nodeName); !strings.Contains(desc, "WaitingForDependencies") {
		t.Errorf("kubectl describe lacks the WaitingForDependencies event:\n%s", desc)
	}

	// A noderun restart with both running changes nothing: web is adopted,
	// not held back while db's status is not known yet.
	n.stop()
	n.start()
	n.waitHealthy()
	again := n.waitPod("web", "Ready again", func(p *v1.Pod) bool { return !podReadySince(p).IsZero() })
	if cs := containerStatus(again, "main"); cs.RestartCount != 0 || !cs.State.Running.StartedAt.Time.Equal(webStarted) ||
		hasEvent(n.events("web"), "WaitingForDependencies", "") {
		t.Errorf("web after a noderun restart: %s, events %+v; want its container kept and no wait", statusJSON(again), n.events("web"))
	}
}

// Pods that wait for each other are refused, by `noderun check` and by the
// node, with file:line; the node runs the rest.
func TestWaitForCycleRefused(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	wait := func(name string) string {
		return "  annotations:\n    noderun.dev/wait-for: " + name + "-" + nodeName + "=Started\n"
	}
	n.writeManifest("a.yaml", waitForPod("a", wait("b"), ""))
	n.writeManifest("b.yaml", waitForPod("b", wait("a"), ""))
	n.writeManifest("free.yaml", waitForPod("free", "", ""))
	n.waitPod("free", "Running", running)
	cycle := ":1: metadata.annotations[noderun.dev/wait-for]: wait-for cycle among default/a-" + nodeName + ", default/b-" + nodeName
	out, err := exec.Command(noderunBin, "check", "--node-name", nodeName, n.podsDir).CombinedOutput()
	for _, f := range []string{"a.yaml", "b.yaml"} {
		if !strings.Contains(string(out), filepath.Join(n.podsDir, f)+cycle) {
			t.Errorf("noderun check lacks %s%s: %v\n%s", f, cycle, err, out)
		}
	}
	if err == nil {
		t.Error("noderun check exited 0")
	}
	if n.pod("a") != nil || n.pod("b") != nil {
		t.Errorf("a pod of the cycle is listed: %v %v", n.pod("a"), n.pod("b"))
	}
}
