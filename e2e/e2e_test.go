package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/snapshots"
	"github.com/opencontainers/image-spec/identity"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/internal/testnode"
	"github.com/noderun/noderun/runner"
	ctrdrt "github.com/noderun/noderun/runner/containerd"
)

// untilTerm keeps a container running and ends it promptly on SIGTERM. The
// trap is needed because sh runs as PID 1, which the kernel shields from
// signals it has no handler for.
const untilTerm = `trap "exit 0" TERM; sleep 3600 & wait`

// sleeperPod is a one-container pod printing line and then waiting for TERM.
func sleeperPod(name, image, line string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
spec:
  terminationGracePeriodSeconds: 5
  containers:
  - name: main
    image: %s
    command: ["sh", "-c", 'echo %s; %s']
`, name, image, line, untilTerm)
}

func containerID(cs v1.ContainerStatus) string {
	return strings.TrimPrefix(cs.ContainerID, "containerd://")
}

// Test 1: a pod starts, its env resolves the downward API and $(VAR)
// references, and its output reaches the CRI log file.
func TestPodRunsWithExpandedEnv(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	written := time.Now()
	n.writeManifest("hello.yaml", `apiVersion: v1
kind: Pod
metadata:
  name: hello
spec:
  terminationGracePeriodSeconds: 5
  containers:
  - name: main
    image: busybox:1.36
    env:
    - name: POD_NAME
      valueFrom: {fieldRef: {fieldPath: metadata.name}}
    - name: GREETING
      value: "hi from $(POD_NAME)"
    command: ["sh", "-c", 'echo "greeting=$(GREETING)"; `+untilTerm+`']
`)
	p := n.waitPod("hello", "Running", running)
	t.Logf("manifest written -> pod Running: %s", time.Since(written).Round(time.Millisecond))

	line := n.waitLogLine(n.logPath(p, "main", 0), "greeting=hi from hello-e2e")
	t.Logf("manifest written -> first log line: %s", line.time.Sub(written).Round(time.Millisecond))

	if p.Namespace != "default" || p.Spec.NodeName != nodeName {
		t.Errorf("namespace/node = %s/%s, want default/%s", p.Namespace, p.Spec.NodeName, nodeName)
	}
	cs := p.Status.ContainerStatuses[0]
	if !cs.Ready || cs.RestartCount != 0 || cs.Started == nil || !*cs.Started {
		t.Errorf("container status = %+v, want ready, started, no restarts", cs)
	}
	if cs.Image != imageNames[0] {
		t.Errorf("image = %q, want %q", cs.Image, imageNames[0])
	}
	if want := runner.ContainerID(string(p.UID), "main", 0); containerID(cs) != want {
		t.Errorf("containerID = %q, want containerd://%s", cs.ContainerID, want)
	}
	if !podConditionTrue(p, v1.PodReady) {
		t.Errorf("Ready condition not true: %+v", p.Status.Conditions)
	}
	if ip := net.ParseIP(p.Status.PodIP); ip == nil || !subnetOf(n).Contains(ip) {
		t.Errorf("podIP %q is not in %s", p.Status.PodIP, n.subnet)
	}

	// containerd holds exactly the container the API reports, labelled
	// with the pod, running the expanded environment.
	cons := n.containers(string(p.UID))
	if len(cons) != 1 || cons[0].ID != containerID(cs) {
		t.Fatalf("containerd has %d containers for the pod, want just %s", len(cons), containerID(cs))
	}
	c := cons[0]
	for k, want := range map[string]string{
		ctrdrt.LabelPodName: "hello-e2e", ctrdrt.LabelPodNamespace: "default",
		ctrdrt.LabelContainer: "main", ctrdrt.LabelRestartCount: "0",
	} {
		if c.Labels[k] != want {
			t.Errorf("label %s = %q, want %q", k, c.Labels[k], want)
		}
	}
	if st := n.task(c.ID); st.Status != tasktypes.Status_RUNNING {
		t.Errorf("task status = %v, want RUNNING", st.Status)
	}
	var spec specs.Spec
	if err := json.Unmarshal(c.Spec.GetValue(), &spec); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"POD_NAME=hello-e2e", "GREETING=hi from hello-e2e"} {
		if !slices.Contains(spec.Process.Env, want) {
			t.Errorf("process env %q lacks %q", spec.Process.Env, want)
		}
	}
}

// Test 2: the pod's IP on the test's bridge answers from the host.
func TestPodIPServesHTTP(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("web.yaml", `apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  terminationGracePeriodSeconds: 5
  containers:
  - name: httpd
    image: busybox:1.36
    env:
    - name: POD_NAME
      valueFrom: {fieldRef: {fieldPath: metadata.name}}
    ports:
    - containerPort: 8080
    command:
    - sh
    - -c
    - |
      mkdir -p /www
      echo "hello from $(POD_NAME)" > /www/index.html
      trap "exit 0" TERM
      httpd -f -p 8080 -h /www &
      wait
`)
	p := n.waitPod("web", "Running", running)
	ip := net.ParseIP(p.Status.PodIP)
	if ip == nil || !subnetOf(n).Contains(ip) {
		t.Fatalf("podIP %q is not in %s", p.Status.PodIP, n.subnet)
	}
	br, err := net.InterfaceByName(n.bridge)
	if err != nil {
		t.Fatalf("bridge %s: %v", n.bridge, err)
	}
	if addrs, _ := br.Addrs(); !slices.ContainsFunc(addrs, func(a net.Addr) bool {
		ipn, ok := a.(*net.IPNet)
		return ok && ipn.Contains(ip)
	}) {
		t.Errorf("bridge %s addresses %v do not cover the pod IP %s", n.bridge, addrs, ip)
	}

	url := "http://" + net.JoinHostPort(p.Status.PodIP, "8080") + "/index.html"
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	deadline := time.Now().Add(waitTimeout)
	var last string
	for time.Now().Before(deadline) {
		// httpd may not listen yet when the container counts as running.
		resp, err := hc.Get(url)
		if err != nil {
			last = err.Error()
			time.Sleep(pollEvery)
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(body) != "hello from web-e2e\n" {
			t.Fatalf("GET %s = %s %q, want 200 %q", url, resp.Status, body, "hello from web-e2e\n")
		}
		return
	}
	t.Fatalf("GET %s never answered: %s", url, last)
}

// Test 3: an exiting container is restarted with the kubelet's crash-loop
// backoff: the first restart at once, the next after 10 s.
func TestCrashLoopBackoff(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("crash.yaml", `apiVersion: v1
kind: Pod
metadata:
  name: crash
spec:
  restartPolicy: Always
  terminationGracePeriodSeconds: 2
  containers:
  - name: crash
    image: busybox:1.36
    command: ["sh", "-c", "echo run; exit 3"]
`)
	var sawBackoff, sawExit3 bool
	lastCount := int32(0)
	// Each run has its own log file; its first line dates the run's start.
	// Only the current and previous runs' logs are kept, so each is read
	// while it is there.
	starts := make([]time.Time, 3)
	p := n.waitPodFor("crash", "restarted twice", 45*time.Second, func(p *v1.Pod) bool {
		if len(p.Status.ContainerStatuses) != 1 {
			return false
		}
		cs := p.Status.ContainerStatuses[0]
		for i := range min(int(cs.RestartCount)+1, len(starts)) {
			if lines := n.readLog(n.logPath(p, "crash", i)); starts[i].IsZero() && len(lines) > 0 {
				starts[i] = lines[0].time
			}
		}
		if cs.RestartCount < lastCount {
			t.Errorf("restartCount went down from %d to %d", lastCount, cs.RestartCount)
		}
		lastCount = cs.RestartCount
		if w := cs.State.Waiting; w != nil && w.Reason == "CrashLoopBackOff" {
			sawBackoff = true
		}
		if lt := cs.LastTerminationState.Terminated; lt != nil {
			if lt.ExitCode != 3 {
				t.Errorf("lastState.terminated.exitCode = %d, want 3", lt.ExitCode)
			}
			sawExit3 = true
		}
		return cs.RestartCount >= 2 && !starts[2].IsZero()
	})
	if !sawBackoff {
		t.Errorf("never saw state.waiting.reason CrashLoopBackOff")
	}
	if !sawExit3 {
		t.Errorf("never saw lastState.terminated")
	}
	if p.Status.Phase != v1.PodRunning {
		t.Errorf("phase = %s, want Running (restartPolicy Always)", p.Status.Phase)
	}

	if starts[0].IsZero() || starts[1].IsZero() {
		t.Fatalf("run starts %v: a run's log was not seen", starts)
	}
	if _, err := os.Stat(n.logPath(p, "crash", 0)); err == nil {
		t.Errorf("run 0's log is still there with run 2 running; the kubelet keeps the current and the previous")
	}
	gap1, gap2 := starts[1].Sub(starts[0]), starts[2].Sub(starts[1])
	t.Logf("restart gaps: %s, %s", gap1.Round(time.Millisecond), gap2.Round(time.Millisecond))
	// Below the 10 s backoff with room for a slow start on a busy machine.
	if gap1 > 8*time.Second {
		t.Errorf("first restart came after %s, want (nearly) immediate", gap1)
	}
	if gap2 < 9*time.Second || gap2 > 20*time.Second {
		t.Errorf("second restart came after %s, want the 10s backoff", gap2)
	}

	// Only the newest run is kept in containerd.
	cons := n.containers(string(p.UID))
	var ids []string
	for _, c := range cons {
		ids = append(ids, c.ID)
	}
	cs := p.Status.ContainerStatuses[0]
	if len(cons) != 1 || cons[0].ID != containerID(cs) {
		t.Errorf("containerd holds %v, want only the current run %s", ids, containerID(cs))
	}
	if want := runner.ContainerID(string(p.UID), "crash", int(cs.RestartCount)); containerID(cs) != want {
		t.Errorf("current containerID %q, want %s", containerID(cs), want)
	}
}

// Test 4: with restartPolicy Never a pod ends Succeeded or Failed, and its
// container is not restarted.
func TestRestartPolicyNever(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	pod := func(name string, code int) string {
		return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", "echo bye; exit %d"]
`, name, code)
	}
	n.writeManifest("ok.yaml", pod("ok", 0))
	n.writeManifest("fail.yaml", pod("fail", 7))

	finished := func(p *v1.Pod) bool {
		return p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed
	}
	for _, tc := range []struct {
		name   string
		phase  v1.PodPhase
		code   int32
		reason string
	}{
		{"ok", v1.PodSucceeded, 0, "Completed"},
		{"fail", v1.PodFailed, 7, "Error"},
	} {
		p := n.waitPod(tc.name, "finished", finished)
		if p.Status.Phase != tc.phase {
			t.Errorf("%s: phase = %s, want %s", tc.name, p.Status.Phase, tc.phase)
		}
		cs := p.Status.ContainerStatuses[0]
		term := cs.State.Terminated
		if term == nil || term.ExitCode != tc.code || term.Reason != tc.reason {
			t.Errorf("%s: state = %+v, want terminated with exit code %d (%s)", tc.name, cs.State, tc.code, tc.reason)
		}
		if cs.RestartCount != 0 || cs.Ready {
			t.Errorf("%s: restartCount %d, ready %v; want 0, false", tc.name, cs.RestartCount, cs.Ready)
		}
		if podConditionTrue(p, v1.PodReady) {
			t.Errorf("%s: Ready condition true for a finished pod", tc.name)
		}
		n.waitLogLine(n.logPath(p, "main", 0), "bye")
		cons := n.containers(string(p.UID))
		if len(cons) != 1 || cons[0].ID != runner.ContainerID(string(p.UID), "main", 0) {
			t.Errorf("%s: containerd holds %d containers, want only the first run", tc.name, len(cons))
		} else if st := n.task(cons[0].ID); st.Status != tasktypes.Status_STOPPED || int32(st.ExitStatus) != tc.code {
			t.Errorf("%s: task %v exit %d, want STOPPED exit %d", tc.name, st.Status, st.ExitStatus, tc.code)
		}
		if _, err := os.Stat(n.logPath(p, "main", 1)); err == nil {
			t.Errorf("%s: a second run's log exists", tc.name)
		}
	}
}

// Test 5: editing a manifest replaces the pod: a new UID, the old containers
// removed, the new command running.
func TestManifestEditReplacesPod(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("edit.yaml", sleeperPod("edit", "busybox:1.36", "version-one"))
	old := n.waitPod("edit", "Running", running)
	n.waitLogLine(n.logPath(old, "main", 0), "version-one")

	n.writeManifest("edit.yaml", sleeperPod("edit", "busybox:1.36", "version-two"))
	p := n.waitPod("edit", "replaced and Running", func(p *v1.Pod) bool { return p.UID != old.UID && running(p) })
	n.waitLogLine(n.logPath(p, "main", 0), "version-two")
	if lines := n.readLog(n.logPath(p, "main", 0)); slices.ContainsFunc(lines, func(l logLine) bool { return l.content == "version-one" }) {
		t.Errorf("new pod's log holds the old output")
	}
	if cs := n.containers(string(old.UID)); len(cs) != 0 {
		t.Errorf("old pod still has %d containers in containerd", len(cs))
	}
	if all := n.containers(""); len(all) != 1 {
		t.Errorf("containerd holds %d containers, want the new pod's one", len(all))
	}
	if _, err := os.Stat(filepath.Join(n.state, "pods", string(old.UID))); !os.IsNotExist(err) {
		t.Errorf("old pod's state dir is still there (%v)", err)
	}
	if len(n.pods()) != 1 {
		t.Errorf("status API lists %d pods, want 1", len(n.pods()))
	}
}

// Test 6: removing manifests removes everything the pods had, within the
// grace period: a container that exits on TERM goes at once, one that
// ignores TERM is killed once its 2 s grace have passed.
func TestManifestRemovalCleansUp(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	baseline := n.snapshots()
	// The default 30s grace: removal must not wait for it when the container exits on TERM.
	n.writeManifest("polite.yaml", strings.Replace(sleeperPod("polite", "busybox:1.36", "polite"),
		"  terminationGracePeriodSeconds: 5\n", "", 1))
	n.writeManifest("stubborn.yaml", `apiVersion: v1
kind: Pod
metadata:
  name: stubborn
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: busybox:1.36
    # No trap: as PID 1, sh never sees SIGTERM, so only SIGKILL ends it.
    command: ["sh", "-c", "while true; do sleep 1; done"]
`)
	polite := n.waitPod("polite", "Running", running)
	if g := polite.Spec.TerminationGracePeriodSeconds; g == nil || *g != 30 {
		t.Fatalf("polite pod's grace period = %v, want the default 30", g)
	}
	stubborn := n.waitPod("stubborn", "Running", running)
	pods := []*v1.Pod{polite, stubborn}
	if len(n.snapshots()) <= len(baseline) {
		t.Fatalf("running pods added no snapshot (%d before)", len(baseline))
	}

	removed := time.Now()
	n.removeManifest("polite.yaml")
	n.removeManifest("stubborn.yaml")
	politeGone := n.waitGone("polite", time.Minute).Sub(removed)
	stubbornGone := n.waitGone("stubborn", time.Minute).Sub(removed)
	t.Logf("removal took %s (exits on TERM), %s (2s grace, ignores TERM)",
		politeGone.Round(time.Millisecond), stubbornGone.Round(time.Millisecond))
	// The upper bounds tell the grace periods apart (30 s, 2 s), with room
	// for a busy machine: they are counted up to when the test saw it.
	if politeGone > 15*time.Second {
		t.Errorf("pod exiting on TERM took %s to remove", politeGone)
	}
	if stubbornGone < 2*time.Second {
		t.Errorf("pod ignoring TERM removed after %s, before its 2s grace period", stubbornGone)
	}
	if stubbornGone > 2*time.Second+13*time.Second {
		t.Errorf("pod ignoring TERM took %s to remove, want its 2s grace plus little", stubbornGone)
	}

	if cs := n.containers(""); len(cs) != 0 {
		t.Errorf("%d containers left", len(cs))
	}
	if ts := n.tasks(); len(ts) != 0 {
		t.Errorf("%d tasks left", len(ts))
	}
	checkOnlyImageSnapshots(t, n, baseline)
	holder := []string{n.holderDir(), filepath.Join(n.holderDir(), "mnt")}
	if m := mountsUnder(t, n.root); !slices.Equal(m, holder) {
		t.Errorf("mounts left under %s: %v, want only the namespace holder's %v", n.root, m, holder)
	}
	if held := n.heldSandboxes(); len(held) != 0 {
		t.Errorf("ipc/uts namespaces left in the holder: %v", held)
	}
	if ents, err := os.ReadDir(filepath.Join(n.run, "pods")); err == nil && len(ents) != 0 {
		t.Errorf("sandbox dirs left in %s: %d", filepath.Join(n.run, "pods"), len(ents))
	}
	for _, p := range pods {
		sb := runner.SandboxID(string(p.UID))
		for _, path := range []string{
			filepath.Join(n.state, "pods", string(p.UID)),
			filepath.Join(n.run, "pods", sb),
			filepath.Join(n.ipamDir(), n.netName, p.Status.PodIP),
			filepath.Join(n.state, "cni", "cache", "results", n.netName+"-"+sb+"-eth0"),
			filepath.Dir(filepath.Dir(n.logPath(p, "main", 0))),
		} {
			if _, err := os.Lstat(path); !os.IsNotExist(err) {
				t.Errorf("%s: %s left behind (%v)", p.Name, path, err)
			}
		}
		for _, root := range cgroupRoots(t) {
			for _, tier := range []string{"", "burstable", "besteffort"} { // the QoS parents
				if dir := filepath.Join(root, "noderun", tier, "pod"+sb); exists(dir) {
					t.Errorf("%s: cgroup %s left behind", p.Name, dir)
				}
			}
		}
	}
}

// checkOnlyImageSnapshots asserts the namespace is back to its image layers:
// the same committed snapshots as before the pods, all in the image's chain.
func checkOnlyImageSnapshots(t *testing.T, n *node, baseline []snapshots.Info) {
	t.Helper()
	img, err := client.GetImage(n.ctx(), imageNames[0])
	if err != nil {
		t.Fatal(err)
	}
	diffIDs, err := img.RootFS(n.ctx())
	if err != nil {
		t.Fatal(err)
	}
	var chain []string
	for _, id := range identity.ChainIDs(diffIDs) {
		chain = append(chain, id.String())
	}
	after := n.snapshots()
	if len(after) != len(baseline) {
		t.Errorf("%d snapshots after removal, %d before the pods", len(after), len(baseline))
	}
	for _, s := range after {
		if s.Kind != snapshots.KindCommitted || !slices.Contains(chain, s.Name) {
			t.Errorf("snapshot %s (%v) is not an image layer", s.Name, s.Kind)
		}
	}
}

// Test 7: noderun killed with SIGKILL leaves its containers running, and a
// new noderun adopts them without restarting anything; a pod whose manifest
// went away meanwhile is torn down.
func TestRestartAdoptsRunningPods(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("steady.yaml", sleeperPod("steady", "busybox:1.36", "steady"))
	n.writeManifest("gone.yaml", sleeperPod("gone", "busybox:1.36", "gone"))
	before := n.waitPod("steady", "Running", running)
	gone := n.waitPod("gone", "Running", running)
	id := containerID(before.Status.ContainerStatuses[0])
	pid := n.task(id).Pid

	n.kill9()
	if st := n.task(id); st.Status != tasktypes.Status_RUNNING || st.Pid != pid {
		t.Fatalf("with noderun dead the task is %v pid %d, want RUNNING pid %d", st.Status, st.Pid, pid)
	}
	n.removeManifest("gone.yaml")
	n.start()

	// The orphan is torn down with its own spec (from the state dir).
	sb := runner.SandboxID(string(gone.UID))
	leftovers := func() []string {
		var out []string
		if cs := n.containers(string(gone.UID)); len(cs) != 0 {
			out = append(out, fmt.Sprintf("%d containers", len(cs)))
		}
		for _, path := range []string{
			filepath.Join(n.state, "pods", string(gone.UID)),
			filepath.Join(n.run, "pods", sb),
			filepath.Join(n.ipamDir(), n.netName, gone.Status.PodIP),
		} {
			if exists(path) {
				out = append(out, path)
			}
		}
		return out
	}
	for deadline := time.Now().Add(waitTimeout); len(leftovers()) > 0 && time.Now().Before(deadline); {
		time.Sleep(pollEvery)
	}
	if l := leftovers(); len(l) > 0 {
		t.Errorf("pod removed while noderun was down left %q", l)
	}
	// Listed as terminating while torn down, then gone.
	n.waitGone("gone", waitTimeout)

	after := n.waitPod("steady", "Running after restart", running)
	cs := after.Status.ContainerStatuses[0]
	if after.UID != before.UID || containerID(cs) != id {
		t.Errorf("after restart: uid %s container %s, want %s %s", after.UID, containerID(cs), before.UID, id)
	}
	if cs.RestartCount != 0 {
		t.Errorf("restartCount = %d after noderun restart, want 0", cs.RestartCount)
	}
	if after.Status.PodIP != before.Status.PodIP {
		t.Errorf("podIP %s after restart, was %s", after.Status.PodIP, before.Status.PodIP)
	}
	if a, b := after.Status.StartTime, before.Status.StartTime; a == nil || b == nil || !a.Equal(b) {
		t.Errorf("startTime %v after restart, was %v", a, b)
	}
	if st := n.task(id); st.Status != tasktypes.Status_RUNNING || st.Pid != pid {
		t.Errorf("task is %v pid %d after restart, want RUNNING pid %d", st.Status, st.Pid, pid)
	}
	if cons := n.containers(""); len(cons) != 1 {
		t.Errorf("containerd holds %d containers, want 1", len(cons))
	}
	if lines := n.readLog(n.logPath(after, "main", 0)); len(lines) != 1 {
		t.Errorf("log has %d lines, want the one line of a single run", len(lines))
	}
}

// Test 8: a bad manifest is reported with its file and does not disturb the
// pods of good files; fixing it brings its pod up.
func TestInvalidManifestReported(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("good.yaml", sleeperPod("good", "busybox:1.36", "good"))
	good := n.waitPod("good", "Running", running)
	goodID := containerID(good.Status.ContainerStatuses[0])
	goodPID := n.task(goodID).Pid

	unknownField := strings.Replace(sleeperPod("typo", "busybox:1.36", "typo"), "command:", "commandz:", 1)
	noImage := strings.Replace(sleeperPod("noimage", "busybox:1.36", "noimage"), "    image: busybox:1.36\n", "", 1)
	n.writeManifest("typo.yaml", unknownField)
	n.writeManifest("noimage.yaml", noImage)
	for _, f := range []string{"typo.yaml", "noimage.yaml"} {
		n.waitOutput(regexp.MustCompile(`manifest error.*` + regexp.QuoteMeta(filepath.Join(n.podsDir, f))))
	}
	for _, name := range []string{"typo", "noimage"} {
		if p := n.pod(name); p != nil {
			t.Errorf("invalid pod %s is listed: %s", name, statusJSON(p))
		}
	}

	n.writeManifest("typo.yaml", sleeperPod("typo", "busybox:1.36", "typo"))
	n.writeManifest("noimage.yaml", sleeperPod("noimage", "busybox:1.36", "noimage"))
	for _, name := range []string{"typo", "noimage"} {
		p := n.waitPod(name, "Running once fixed", running)
		n.waitLogLine(n.logPath(p, "main", 0), name)
	}

	g := n.pod("good")
	if g == nil {
		t.Fatal("good pod disappeared")
	}
	cs := g.Status.ContainerStatuses[0]
	if g.UID != good.UID || containerID(cs) != goodID || cs.RestartCount != 0 || !running(g) {
		t.Errorf("good pod was disturbed: %s", statusJSON(g))
	}
	if st := n.task(goodID); st.Status != tasktypes.Status_RUNNING || st.Pid != goodPID {
		t.Errorf("good pod's task is %v pid %d, want RUNNING pid %d", st.Status, st.Pid, goodPID)
	}
}

// waitOutput waits until noderun's output matches re.
func (n *node) waitOutput(re *regexp.Regexp) {
	n.t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for time.Now().Before(deadline) {
		b, err := os.ReadFile(n.out)
		if err != nil {
			n.t.Fatal(err)
		}
		if re.Match(b) {
			return
		}
		time.Sleep(pollEvery)
	}
	n.t.Fatalf("noderun output never matched %s", re)
}

// Test 9: an init container runs to completion first, and what it writes to
// an emptyDir is there for the app container.
func TestInitContainerFillsEmptyDir(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("init.yaml", `apiVersion: v1
kind: Pod
metadata:
  name: init
spec:
  terminationGracePeriodSeconds: 5
  volumes:
  - name: shared
    emptyDir: {}
  initContainers:
  - name: prepare
    image: registry.k8s.io/busybox:1.27.2
    command: ["sh", "-c", "echo prepared-by-init > /shared/msg"]
    volumeMounts:
    - {name: shared, mountPath: /shared}
  containers:
  - name: app
    image: busybox:1.36
    command: ["sh", "-c", 'cat /shared/msg; `+untilTerm+`']
    volumeMounts:
    - {name: shared, mountPath: /shared}
`)
	p := n.waitPod("init", "Running", running)
	n.waitLogLine(n.logPath(p, "app", 0), "prepared-by-init")
	if len(p.Status.InitContainerStatuses) != 1 {
		t.Fatalf("initContainerStatuses = %+v", p.Status.InitContainerStatuses)
	}
	ics := p.Status.InitContainerStatuses[0]
	term := ics.State.Terminated
	if term == nil || term.ExitCode != 0 || term.Reason != "Completed" {
		t.Fatalf("init container state = %+v, want terminated Completed", ics.State)
	}
	if started := p.Status.ContainerStatuses[0].State.Running.StartedAt; started.Before(&term.FinishedAt) {
		t.Errorf("app started at %s, before the init container finished at %s", started, term.FinishedAt)
	}
	if !podConditionTrue(p, v1.PodInitialized) {
		t.Errorf("Initialized condition not true: %+v", p.Status.Conditions)
	}
	b, err := os.ReadFile(filepath.Join(n.state, "pods", string(p.UID), "volumes", "empty-dir", "shared", "msg"))
	if err != nil || string(b) != "prepared-by-init\n" {
		t.Errorf("emptyDir file on the host = %q, %v", b, err)
	}
}

// Test 10: `noderun pods` prints kubectl's table from the status API.
func TestPodsCommand(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("table.yaml", sleeperPod("table", "busybox:1.36", "table"))
	p := n.waitPod("table", "Running", running)

	out, err := exec.Command(noderunBin, "--status-socket", n.socket, "pods").Output()
	if err != nil {
		t.Fatalf("noderun pods: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if got := strings.Fields(lines[0]); !slices.Equal(got, []string{"NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP"}) {
		t.Fatalf("header = %q", lines[0])
	}
	var row []string
	for _, l := range lines[1:] {
		if f := strings.Fields(l); len(f) > 1 && f[1] == "table-e2e" {
			row = f
		}
	}
	if len(row) != 7 {
		t.Fatalf("no 7-column row for table-e2e in:\n%s", out)
	}
	want := []string{"default", "table-e2e", "1/1", "Running", "0", row[5], p.Status.PodIP}
	if !slices.Equal(row, want) {
		t.Errorf("row = %q, want %q", row, want)
	}
	if !regexp.MustCompile(`^\d+s$`).MatchString(row[5]) {
		t.Errorf("AGE = %q, want seconds for a fresh pod", row[5])
	}
}

func podConditionTrue(p *v1.Pod, ct v1.PodConditionType) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == ct {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}

func subnetOf(n *node) *net.IPNet {
	_, ipn, _ := net.ParseCIDR(n.subnet)
	return ipn
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// cgroupRoots lists the mount points of the cgroup hierarchies.
func cgroupRoots(t *testing.T) []string {
	t.Helper()
	return hostMounts(t, "/", func(m testnode.Mount) bool { return m.FSType == "cgroup" || m.FSType == "cgroup2" })
}

// Container logs keep being written while noderun is down: the log
// collector is a process of its own, and a restarted noderun takes up
// holding its pipes again.
func TestLogsWrittenWhileNoderunDown(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("talker.yaml", `apiVersion: v1
kind: Pod
metadata: {name: talker}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", "trap 'exit 0' TERM; i=0; while :; do i=$((i+1)); echo line $i; sleep 0.1 & wait; done"]
`)
	p := n.waitPod("talker", "Running", running)
	path := n.logPath(p, "main", 0)
	n.waitLogLine(path, "line 3")
	n.kill9()
	down := len(n.readLog(path))
	deadline := time.Now().Add(waitTimeout)
	for len(n.readLog(path)) < down+10 && time.Now().Before(deadline) {
		time.Sleep(pollEvery)
	}
	if got := len(n.readLog(path)); got < down+10 {
		t.Fatalf("log grew from %d to %d lines while noderun was down", down, got)
	}
	lines := n.readLog(path)
	for i, l := range lines[:len(lines)-1] { // the last may be mid-write
		if want := fmt.Sprintf("line %d", i+1); l.content != want {
			t.Fatalf("log line %d is %q, want %q: lines lost or mangled", i+1, l.content, want)
		}
	}
	collector := n.collectorPID()
	n.start()
	n.waitPod("talker", "Running after restart", running)
	n.waitLogLine(path, fmt.Sprintf("line %d", len(n.readLog(path))+10))
	if _, err := n.logStream(path); err != nil {
		t.Fatalf("the restarted noderun does not see the collector's stream: %v", err)
	}
	if pid := n.collectorPID(); pid != collector {
		t.Fatalf("the log collector changed across a noderun restart: PID %d, then %d", collector, pid)
	}
}
