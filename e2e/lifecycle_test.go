package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// events returns the node's events about the static pod from manifest name.
func (n *node) events(name string) []v1.Event {
	n.t.Helper()
	var list v1.EventList
	if err := n.get("/events", &list); err != nil {
		n.t.Fatal(err)
	}
	var out []v1.Event
	for _, ev := range list.Items {
		if ev.InvolvedObject.Name == name+"-"+nodeName {
			out = append(out, ev)
		}
	}
	return out
}

func hasEvent(evs []v1.Event, reason, prefix string) bool {
	return slices.ContainsFunc(evs, func(ev v1.Event) bool {
		return ev.Reason == reason && strings.HasPrefix(ev.Message, prefix)
	})
}

func containerStatus(p *v1.Pod, name string) *v1.ContainerStatus {
	for _, list := range [][]v1.ContainerStatus{p.Status.ContainerStatuses, p.Status.InitContainerStatuses} {
		for i := range list {
			if list[i].Name == name {
				return &list[i]
			}
		}
	}
	return nil
}

func podCondition(p *v1.Pod, t v1.PodConditionType) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == t {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}

// livenessPod's container turns unhealthy 3 s after it starts; its probe
// (period 1 s, failureThreshold 2) then fails twice, and sh as PID 1
// ignores SIGTERM, so the kill waits the 2 s grace period.
func livenessPod(name, image, script, probe string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: %s
    command: ["sh", "-c", %q]
    livenessProbe:
      %s
      initialDelaySeconds: 1
      periodSeconds: 1
      failureThreshold: 2
`, name, image, script, probe)
}

// TestLifecycleLivenessRestarts: each kind of liveness probe restarts its
// container once the target turns unhealthy, as the kubelet times it.
func TestLifecycleLivenessRestarts(t *testing.T) {
	t.Parallel()
	n := newNodeWithImages(t, []string{probeServerTar(t)})
	pods := map[string]string{
		"exec": livenessPod("live-exec", "busybox:1.36",
			"touch /tmp/healthy; sleep 3; rm /tmp/healthy; sleep 3600",
			`exec: {command: ["cat", "/tmp/healthy"]}`),
		"http": livenessPod("live-http", "busybox:1.36",
			"mkdir /tmp/w; echo ok > /tmp/w/healthz; httpd -p 8080 -h /tmp/w; sleep 3; rm /tmp/w/healthz; sleep 3600",
			`httpGet: {path: /healthz, port: 8080}`),
		"tcp": livenessPod("live-tcp", "busybox:1.36",
			"httpd -p 8080 -h /tmp; sleep 3; killall httpd; sleep 3600",
			`tcpSocket: {port: 8080}`),
		"grpc": livenessPod("live-grpc", probeServerRef,
			"/probeserver -grpc :9090 -unhealthy-after 3s & sleep 3600",
			`grpc: {port: 9090}`),
	}
	for kind, m := range pods {
		n.writeManifest("live-"+kind+".yaml", m)
	}
	for kind := range pods {
		name := "live-" + kind
		p := n.waitPodFor(name, "restarted by its liveness probe", 40*time.Second, func(p *v1.Pod) bool {
			cs := containerStatus(p, "main")
			return cs != nil && cs.RestartCount >= 1 && cs.LastTerminationState.Terminated != nil
		})
		last := containerStatus(p, "main").LastTerminationState.Terminated
		if last.Reason != "Error" || last.ExitCode != 137 {
			t.Errorf("%s: lastState %s/%d, want Error/137", kind, last.Reason, last.ExitCode)
		}
		// Unhealthy at 3 s; failures at the ticks after it (period 1 s,
		// threshold 2), then 2 s of grace: ~6-7 s. Killing at the first
		// failure would end before 5 s.
		ran := last.FinishedAt.Sub(last.StartedAt.Time)
		t.Logf("%s: first run lasted %s (kubelet: unhealthy at 3 s, failures at the next 2 ticks, 2 s grace: ~6-7 s)", kind, ran)
		if ran < 4500*time.Millisecond || ran > 12*time.Second {
			t.Errorf("%s: the first run lasted %s, want about 6-7 s (unhealthy at 3 s + 2 failures + 2 s grace)", kind, ran)
		}
		evs := n.events(name)
		if !hasEvent(evs, "Unhealthy", "Liveness probe failed:") || !hasEvent(evs, "Killing", "Container main failed liveness probe, will be restarted") {
			t.Errorf("%s: events lack Unhealthy/Killing: %+v", kind, evs)
		}
	}
}

// TestLifecycleReadinessFlips: Ready follows the readiness probe both ways,
// never before its first success, and readiness never restarts anything.
func TestLifecycleReadinessFlips(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("ready.yaml", `apiVersion: v1
kind: Pod
metadata:
  name: ready
spec:
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", "mkdir /tmp/w; httpd -p 8080 -h /tmp/w; sleep 4; touch /tmp/w/ok; sleep 4; rm /tmp/w/ok; sleep 4; touch /tmp/w/ok; sleep 3600"]
    readinessProbe:
      httpGet: {path: /ok, port: 8080}
      periodSeconds: 1
      failureThreshold: 1
`)
	var seen []bool
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && len(seen) < 4 {
		if p := n.pod("ready"); p != nil && running(p) {
			cs := containerStatus(p, "main")
			ready := podCondition(p, v1.PodReady)
			if ready != cs.Ready || ready != podCondition(p, v1.ContainersReady) {
				t.Fatalf("container ready %t, Ready %t, ContainersReady %t disagree", cs.Ready, ready, podCondition(p, v1.ContainersReady))
			}
			if cs.RestartCount != 0 {
				t.Fatalf("readiness restarted the container")
			}
			if len(seen) == 0 || seen[len(seen)-1] != ready {
				seen = append(seen, ready)
			}
		}
		time.Sleep(pollEvery / 2)
	}
	if want := []bool{false, true, false, true}; !slices.Equal(seen, want) {
		t.Fatalf("Ready went %v, want %v", seen, want)
	}
	if !hasEvent(n.events("ready"), "Unhealthy", "Readiness probe failed: HTTP probe failed with statuscode: 404") {
		t.Errorf("no Unhealthy readiness event: %+v", n.events("ready"))
	}
}

// TestLifecycleStartupProbeHoldsLiveness: a liveness probe that would fail
// at once waits until the startup probe succeeded.
func TestLifecycleStartupProbeHoldsLiveness(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("slow.yaml", `apiVersion: v1
kind: Pod
metadata:
  name: slow
spec:
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", "sleep 4; touch /tmp/up; sleep 3600"]
    startupProbe:
      exec: {command: ["cat", "/tmp/up"]}
      periodSeconds: 1
      failureThreshold: 20
    livenessProbe:
      exec: {command: ["cat", "/tmp/up"]}
      periodSeconds: 1
      failureThreshold: 1
`)
	p := n.waitPod("slow", "running", running)
	if cs := containerStatus(p, "main"); *cs.Started || cs.Ready {
		t.Fatalf("started %t ready %t right after start", *cs.Started, cs.Ready)
	}
	p = n.waitPodFor("slow", "started", 15*time.Second, func(p *v1.Pod) bool {
		cs := containerStatus(p, "main")
		return cs.Started != nil && *cs.Started && cs.Ready
	})
	cs := containerStatus(p, "main")
	if since := time.Since(cs.State.Running.StartedAt.Time); since < 3*time.Second {
		t.Errorf("started %s after the container began; it creates /tmp/up at 4 s", since)
	}
	time.Sleep(3 * time.Second)
	if cs := containerStatus(n.pod("slow"), "main"); cs.RestartCount != 0 {
		t.Fatalf("restarted %d times: liveness ran before the startup probe passed", cs.RestartCount)
	}
}

// TestLifecycleExecProbeTimeout: an exec probe past timeoutSeconds fails
// and its process is killed.
func TestLifecycleExecProbeTimeout(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("hang.yaml", `apiVersion: v1
kind: Pod
metadata:
  name: hang
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: busybox:1.36
    command: ["sleep", "3600"]
    readinessProbe:
      exec: {command: ["sleep", "30"]}
      timeoutSeconds: 1
      periodSeconds: 3
`)
	n.waitPod("hang", "running", running)
	deadline := time.Now().Add(20 * time.Second)
	for !hasEvent(n.events("hang"), "Unhealthy", `Readiness probe failed: command timed out: "sleep 30" timed out after 1s`) {
		if time.Now().After(deadline) {
			t.Fatalf("no timed-out probe event: %+v", n.events("hang"))
		}
		time.Sleep(pollEvery)
	}
	// The probe's sleep was killed at the timeout: within a period no
	// "sleep 30" may remain, though probes keep starting new ones.
	time.Sleep(1200 * time.Millisecond)
	for _, pid := range n.podPIDs(n.pod("hang")) {
		if cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); strings.Contains(string(cmd), "sleep\x0030") {
			if age := procAge(t, pid); age > 1500*time.Millisecond {
				t.Errorf("probe process %d (sleep 30) still runs %s after it started; the timeout is 1 s", pid, age)
			}
		}
	}
	if p := n.pod("hang"); podCondition(p, v1.PodReady) {
		t.Error("Ready although every readiness probe timed out")
	}
}

// podPIDs lists the processes in the pod's containers (their cgroups).
func (n *node) podPIDs(p *v1.Pod) []int {
	n.t.Helper()
	var out []int
	for _, c := range n.containers(string(p.UID)) {
		task, err := client.LoadContainer(n.ctx(), c.ID)
		if err != nil {
			continue
		}
		tk, err := task.Task(n.ctx(), nil)
		if err != nil {
			continue
		}
		pids, err := tk.Pids(n.ctx())
		if err != nil {
			continue
		}
		for _, pi := range pids {
			out = append(out, int(pi.Pid))
		}
	}
	return out
}

// procAge is how long ago the process started.
func procAge(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	start, _ := strconv.ParseFloat(fields[19], 64) // starttime, in clock ticks
	up, _ := os.ReadFile("/proc/uptime")
	now, _ := strconv.ParseFloat(strings.Fields(string(up))[0], 64)
	return time.Duration((now - start/100) * float64(time.Second))
}

// TestLifecyclePostStart: the hook's effect is there when the container is
// first reported Running; a failing hook kills the container.
func TestLifecyclePostStart(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	dir := t.TempDir()
	n.writeManifest("hooked.yaml", fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: hooked
spec:
  containers:
  - name: main
    image: busybox:1.36
    command: ["sleep", "3600"]
    volumeMounts: [{name: out, mountPath: /out}]
    lifecycle:
      postStart:
        exec: {command: ["sh", "-c", "sleep 2; echo hello from postStart > /out/msg"]}
  volumes:
  - {name: out, hostPath: {path: %s}}
`, dir))
	deadline := time.Now().Add(waitTimeout)
	for {
		if p := n.pod("hooked"); p != nil && running(p) {
			b, err := os.ReadFile(filepath.Join(dir, "msg"))
			if err != nil || string(b) != "hello from postStart\n" {
				t.Fatalf("reported Running before postStart finished: msg %q, %v", b, err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("never Running")
		}
		time.Sleep(pollEvery / 4)
	}

	n.writeManifest("badhook.yaml", `apiVersion: v1
kind: Pod
metadata:
  name: badhook
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: busybox:1.36
    command: ["sleep", "3600"]
    lifecycle:
      postStart:
        exec: {command: ["sh", "-c", "echo no; exit 1"]}
`)
	n.waitPodFor("badhook", "restarted after its failed postStart", 30*time.Second, func(p *v1.Pod) bool {
		return containerStatus(p, "main").RestartCount >= 1
	})
	if !hasEvent(n.events("badhook"), "FailedPostStartHook", "") {
		t.Errorf("no FailedPostStartHook event: %+v", n.events("badhook"))
	}
}

// uptimeLog parses "<tag> <uptime>" lines a pod appended to a host file.
func uptimeLog(t *testing.T, path string) map[string]float64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if tag, v, ok := strings.Cut(line, " "); ok {
			f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			out[tag] = f
		}
	}
	return out
}

// TestLifecyclePreStop: on removal the hook runs before SIGTERM, inside the
// grace period; what it uses is gone from the signal's share.
func TestLifecyclePreStop(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	dir := t.TempDir()
	n.writeManifest("drain.yaml", fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: drain
spec:
  terminationGracePeriodSeconds: 10
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", "trap 'echo term $(cut -d\" \" -f1 /proc/uptime) >> /out/log; exit 0' TERM; while :; do sleep 0.1; done"]
    volumeMounts: [{name: out, mountPath: /out}]
    lifecycle:
      preStop:
        exec: {command: ["sh", "-c", "echo prestop $(cut -d' ' -f1 /proc/uptime) >> /out/log; sleep 3"]}
  volumes:
  - {name: out, hostPath: {path: %s}}
`, dir))
	// sh as PID 1 ignores SIGTERM: only the grace period's end stops it.
	n.writeManifest("stubborn.yaml", `apiVersion: v1
kind: Pod
metadata:
  name: stubborn
spec:
  terminationGracePeriodSeconds: 5
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", "while :; do sleep 0.1; done"]
    lifecycle:
      preStop:
        sleep: {seconds: 3}
`)
	n.waitPod("drain", "running", running)
	n.waitPod("stubborn", "running", running)
	removed := time.Now()
	n.removeManifest("drain.yaml")
	n.removeManifest("stubborn.yaml")
	goneStubborn := n.waitGone("stubborn", 20*time.Second)
	n.waitGone("drain", 20*time.Second)
	log := uptimeLog(t, filepath.Join(dir, "log"))
	pre, term := log["prestop"], log["term"]
	if pre == 0 || term == 0 || term-pre < 2.8 || term-pre > 5 {
		t.Errorf("prestop at %.2f, SIGTERM at %.2f: want SIGTERM ~3 s after the hook began", pre, term)
	}
	// 3 s of preStop sleep, then the remaining 2 s of the 5 s grace: the
	// kubelet does not restart the grace period after the hook.
	t.Logf("preStop began %.2f s before SIGTERM; the stubborn pod went %s after removal (kubelet: 3 s, 5 s)", term-pre, goneStubborn.Sub(removed))
	if took := goneStubborn.Sub(removed); took < 4500*time.Millisecond || took > 7500*time.Millisecond {
		t.Errorf("the stubborn pod took %s to go, want about 5 s (its whole grace period)", took)
	}
}

// TestLifecycleSidecar: a restartable init container starts before the app
// container, keeps running, and stops after it; the pod completes when its
// app container does.
func TestLifecycleSidecar(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	dir := t.TempDir()
	n.writeManifest("side.yaml", fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: side
spec:
  terminationGracePeriodSeconds: 5
  initContainers:
  - name: proxy
    image: busybox:1.36
    restartPolicy: Always
    command: ["sh", "-c", "trap 'echo proxy-term $(cut -d\" \" -f1 /proc/uptime) >> /out/log; sleep 0.5; exit 0' TERM; while :; do sleep 0.1; done"]
    volumeMounts: [{name: out, mountPath: /out}]
    readinessProbe:
      exec: {command: ["true"]}
      periodSeconds: 1
  containers:
  - name: app
    image: busybox:1.36
    command: ["sh", "-c", "trap 'echo app-term $(cut -d\" \" -f1 /proc/uptime) >> /out/log; exit 0' TERM; while :; do sleep 0.1; done"]
    volumeMounts: [{name: out, mountPath: /out}]
  volumes:
  - {name: out, hostPath: {path: %s}}
`, dir))
	p := n.waitPod("side", "Ready", func(p *v1.Pod) bool { return podCondition(p, v1.PodReady) })
	proxy, app := containerStatus(p, "proxy"), containerStatus(p, "app")
	if proxy.State.Running == nil || !proxy.Ready || app.State.Running == nil || !podCondition(p, v1.PodInitialized) {
		t.Fatalf("sidecar %+v app %+v: both must run, the sidecar ready, the pod initialized", proxy.State, app.State)
	}
	if !proxy.State.Running.StartedAt.Before(&app.State.Running.StartedAt) && !proxy.State.Running.StartedAt.Equal(&app.State.Running.StartedAt) {
		t.Errorf("sidecar started %s, app %s: the sidecar must start first", proxy.State.Running.StartedAt, app.State.Running.StartedAt)
	}
	n.removeManifest("side.yaml")
	n.waitGone("side", 30*time.Second)
	log := uptimeLog(t, filepath.Join(dir, "log"))
	if log["app-term"] == 0 || log["proxy-term"] == 0 || log["proxy-term"] < log["app-term"] {
		t.Errorf("app TERM at %.2f, sidecar TERM at %.2f: the sidecar must be stopped after the app", log["app-term"], log["proxy-term"])
	}

	// A job with a sidecar: the pod ends Succeeded although the sidecar ran.
	n.writeManifest("job.yaml", `apiVersion: v1
kind: Pod
metadata:
  name: job
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 2
  initContainers:
  - name: proxy
    image: busybox:1.36
    restartPolicy: Always
    command: ["sleep", "3600"]
  containers:
  - name: work
    image: busybox:1.36
    command: ["sh", "-c", "sleep 2"]
`)
	p = n.waitPodFor("job", "Succeeded", 30*time.Second, func(p *v1.Pod) bool { return p.Status.Phase == v1.PodSucceeded })
	if cs := containerStatus(p, "work"); cs.State.Terminated == nil || cs.State.Terminated.Reason != "Completed" {
		t.Errorf("work: %+v", cs.State)
	}
	n.waitPodFor("job", "sidecar stopped", 10*time.Second, func(p *v1.Pod) bool {
		return containerStatus(p, "proxy").State.Running == nil
	})
}

// TestLifecycleOOMKilled: a container over its memory limit ends OOMKilled
// with 137 and then waits in CrashLoopBackOff.
func TestLifecycleOOMKilled(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("hog.yaml", `apiVersion: v1
kind: Pod
metadata:
  name: hog
spec:
  containers:
  - name: main
    image: busybox:1.36
    command: ["tail", "/dev/zero"]
    resources:
      limits: {memory: 64Mi}
`)
	p := n.waitPodFor("hog", "CrashLoopBackOff after an OOM kill", 40*time.Second, func(p *v1.Pod) bool {
		cs := containerStatus(p, "main")
		return cs.State.Waiting != nil && cs.State.Waiting.Reason == "CrashLoopBackOff" && cs.LastTerminationState.Terminated != nil
	})
	last := containerStatus(p, "main").LastTerminationState.Terminated
	if last.Reason != "OOMKilled" || last.ExitCode != 137 {
		t.Fatalf("lastState %s/%d, want OOMKilled/137", last.Reason, last.ExitCode)
	}
}

// TestLifecycleTerminationMessage: the file, a custom path, and the log
// fallback fill state.terminated.message.
func TestLifecycleTerminationMessage(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("msg.yaml", `apiVersion: v1
kind: Pod
metadata:
  name: msg
spec:
  restartPolicy: Never
  containers:
  - name: file
    image: busybox:1.36
    command: ["sh", "-c", "printf 'disk full' > /dev/termination-log; exit 3"]
  - name: custom
    image: busybox:1.36
    securityContext: {runAsUser: 65534}
    terminationMessagePath: /tmp/why
    command: ["sh", "-c", "printf done > /tmp/why"]
  - name: logs
    image: busybox:1.36
    terminationMessagePolicy: FallbackToLogsOnError
    command: ["sh", "-c", "echo first; sleep 0.3; echo last >&2; exit 1"]
`)
	p := n.waitPodFor("msg", "Failed", 30*time.Second, func(p *v1.Pod) bool { return p.Status.Phase == v1.PodFailed })
	for name, want := range map[string]string{"file": "disk full", "custom": "done", "logs": "first\nlast\n"} {
		term := containerStatus(p, name).State.Terminated
		if term == nil || term.Message != want {
			t.Errorf("%s: terminated %+v, want message %q", name, term, want)
		}
	}
}

// TestLifecycleActiveDeadline: the pod fails with DeadlineExceeded and its
// containers are stopped.
func TestLifecycleActiveDeadline(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("late.yaml", `apiVersion: v1
kind: Pod
metadata:
  name: late
spec:
  activeDeadlineSeconds: 3
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: busybox:1.36
    command: ["sleep", "3600"]
`)
	p := n.waitPodFor("late", "Failed", 20*time.Second, func(p *v1.Pod) bool { return p.Status.Phase == v1.PodFailed })
	if p.Status.Reason != "DeadlineExceeded" {
		t.Errorf("reason %q, want DeadlineExceeded", p.Status.Reason)
	}
	if took := time.Since(p.Status.StartTime.Time); took < 3*time.Second {
		t.Errorf("failed %s after its start, before the 3 s deadline", took)
	}
	n.waitPodFor("late", "stopped", 10*time.Second, func(p *v1.Pod) bool { return containerStatus(p, "main").State.Running == nil })
}

// TestLifecycleStartError: a command that does not exist ends the run with
// StartError and exit code 128, as under containerd's CRI.
func TestLifecycleStartError(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("nocmd.yaml", `apiVersion: v1
kind: Pod
metadata:
  name: nocmd
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: busybox:1.36
    command: ["/no/such/binary"]
`)
	p := n.waitPodFor("nocmd", "Failed", 20*time.Second, func(p *v1.Pod) bool { return p.Status.Phase == v1.PodFailed })
	term := containerStatus(p, "main").State.Terminated
	if term == nil || term.Reason != "StartError" || term.ExitCode != 128 || !strings.Contains(term.Message, "/no/such/binary") {
		t.Fatalf("terminated %+v, want StartError/128 naming the binary", term)
	}
}

// TestLifecycleInitRerunsInNewSandbox: when the pod's network has to be
// recreated (its veth deleted), the kubelet starts the pod over in the new
// sandbox from its first init container.
func TestLifecycleInitRerunsInNewSandbox(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	dir := t.TempDir()
	n.writeManifest("setup.yaml", fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: setup
spec:
  terminationGracePeriodSeconds: 1
  initContainers:
  - name: init
    image: busybox:1.36
    command: ["sh", "-c", "echo init >> /out/runs"]
    volumeMounts: [{name: out, mountPath: /out}]
  containers:
  - name: main
    image: busybox:1.36
    command: ["sleep", "3600"]
  volumes:
  - {name: out, hostPath: {path: %s}}
`, dir))
	n.waitPod("setup", "Running", running)
	veths := n.hostVeths()
	if len(veths) != 1 {
		t.Fatalf("veths on the bridge: %v, want one", veths)
	}
	if out, err := exec.Command("ip", "link", "del", veths[0]).CombinedOutput(); err != nil {
		t.Fatalf("ip link del: %v: %s", err, out)
	}
	p := n.waitPod("setup", "running again in a new sandbox", func(p *v1.Pod) bool {
		return running(p) && containerStatus(p, "main").RestartCount == 1
	})
	if cs := containerStatus(p, "init"); cs.RestartCount != 1 || cs.State.Terminated == nil || cs.State.Terminated.ExitCode != 0 {
		t.Errorf("init container: restarts %d, state %+v; want it run again to completion", cs.RestartCount, cs.State)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "runs")); string(b) != "init\ninit\n" {
		t.Fatalf("init runs %q, want two", b)
	}
}
