package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd"
	apievents "github.com/containerd/containerd/api/events"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/crilog"
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

// eventCount sums the counts of the events with reason whose message starts
// with prefix (repeats are folded into one event's count).
func eventCount(evs []v1.Event, reason, prefix string) int32 {
	var n int32
	for _, ev := range evs {
		if ev.Reason == reason && strings.HasPrefix(ev.Message, prefix) {
			n += ev.Count
		}
	}
	return n
}

// eventsText lists events one a line, for failure messages.
func eventsText(evs []v1.Event) string {
	var b strings.Builder
	for _, ev := range evs {
		fmt.Fprintf(&b, "\n\t%s %s %s: %s (x%d)", ev.LastTimestamp.Format(time.TimeOnly), ev.InvolvedObject.FieldPath, ev.Reason, ev.Message, ev.Count)
	}
	return b.String()
}

// lineTimes waits for a stdout line want in a run's log and returns when
// each such line was written, oldest first. Log times have nanoseconds,
// where status times have whole seconds.
func (n *node) lineTimes(p *v1.Pod, container string, run int, want string) []time.Time {
	n.t.Helper()
	path := n.logPath(p, container, run)
	n.waitLogLine(path, want)
	var out []time.Time
	for _, l := range n.readLog(path) {
		if l.stream == crilog.Stdout && l.content == want {
			out = append(out, l.time)
		}
	}
	return out
}

// firstLine returns when a run's log got its first stdout line want, if
// it has one (it does not wait).
func (n *node) firstLine(p *v1.Pod, container string, run int, want string) (time.Time, bool) {
	n.t.Helper()
	for _, l := range n.readLog(n.logPath(p, container, run)) {
		if l.stream == crilog.Stdout && l.content == want {
			return l.time, true
		}
	}
	return time.Time{}, false
}

// metricsReader reads noderun's /metrics with the view token: one HTTPS
// request, quick enough to make beside a status poll.
type metricsReader struct {
	n      *node
	url    string
	token  string
	client *http.Client
}

func (n *node) metricsReader() *metricsReader {
	n.t.Helper()
	ca, token := n.viewCreds()
	return &metricsReader{n: n, url: n.apiServer() + "/metrics", token: token, client: trustingClient(ca, 10*time.Second)}
}

func (m *metricsReader) read() string {
	m.n.t.Helper()
	req, err := http.NewRequest(http.MethodGet, m.url, nil)
	if err != nil {
		m.n.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+m.token)
	resp, err := m.client.Do(req)
	if err != nil {
		m.n.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		m.n.t.Fatalf("GET /metrics: %s %v: %s", resp.Status, err, b)
	}
	return string(b)
}

// probeCounts picks from metrics noderun's prober_probe_total for one probe
// of a pod's container: attempts by result ("successful", "failed",
// "unknown"). noderun counts each result before acting on it, so a status
// read before the counts never shows a change the counts do not explain.
func probeCounts(t *testing.T, metrics, pod, container, probeType string) map[string]int {
	t.Helper()
	out := map[string]int{}
	want := []string{fmt.Sprintf("container=%q", container), fmt.Sprintf("pod=%q", pod+"-"+nodeName), fmt.Sprintf("probe_type=%q", probeType)}
	for _, l := range strings.Split(metrics, "\n") {
		rest, ok := strings.CutPrefix(l, "prober_probe_total{")
		labels, value, found := strings.Cut(rest, "} ")
		if !ok || !found || !allIn(labels, want) {
			continue
		}
		_, result, _ := strings.Cut(labels, `result="`)
		result, _, _ = strings.Cut(result, `"`)
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", l, err)
		}
		out[result] = int(v)
	}
	return out
}

func allIn(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// condition returns a pod condition of type t, or nil.
func condition(p *v1.Pod, t v1.PodConditionType) *v1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == t {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

// checkTiming logs a measured delay beside the kubelet's and fails it
// outside [lo, hi].
func checkTiming(t *testing.T, what string, got, lo, hi time.Duration, kubelet string) {
	t.Helper()
	t.Logf("%s: %s (kubelet: %s)", what, got.Round(time.Millisecond), kubelet)
	if got < lo || got > hi {
		t.Errorf("%s: %s, want %s to %s (kubelet: %s)", what, got.Round(time.Millisecond), lo, hi, kubelet)
	}
}

// probeServer runs testdata/probeserver in the background: gRPC health on
// 9090, HTTP /healthz on 8080 and a TCP listener on 8081, all healthy while
// /tmp/healthy exists; it prints "healthy" and "unhealthy" as that changes.
const probeServer = "/probeserver -grpc :9090 -http :8080 -tcp :8081 -healthy-file /tmp/healthy & "

// probeServerListening waits, in a script, until probeServer listens on
// its gRPC port (0x2382 in the pod's /proc/net/tcp6: Go's listener is
// dual-stack), which it opens after the others: on a busy machine it may
// start seconds after the shell.
const probeServerListening = "until grep -qs ':2382 [0:]* 0A' /proc/net/tcp /proc/net/tcp6; do sleep 0.1; done; "

// probeHandlers are the four kinds of probe, each against probeServer (or
// its file); the ports go by name where Kubernetes allows it.
var probeHandlers = map[string]string{
	"exec": `exec: {command: [cat, /tmp/healthy]}`,
	"http": `httpGet: {path: /healthz, port: http}`,
	"tcp":  `tcpSocket: {port: raw}`,
	"grpc": `grpc: {port: 9090}`,
}

// probedPod is one container of the probeserver image running script (sh
// as PID 1, which ignores SIGTERM unless the script traps it) with probe,
// an indented YAML block of probe fields.
func probedPod(name, script, probe string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: %s
    ports: [{name: http, containerPort: 8080}, {name: raw, containerPort: 8081}]
    command: ["sh", "-c", %q]
%s`, name, probeServerRef, script, probe)
}

// TestLifecycleLivenessRestarts: each kind of liveness probe restarts its
// container once the target has failed failureThreshold probes in a row,
// with the pod's grace period between SIGTERM and SIGKILL. What proves it is
// noderun's record (events, the runs' times, the log) and the order of
// things, not when the test happened to look: that depends on the machine.
func TestLifecycleLivenessRestarts(t *testing.T) {
	t.Parallel()
	n := newNodeWithImages(t, []string{probeServerTar(t)})
	// The trap logs SIGTERM and carries on, so SIGKILL ends the run at the
	// end of the 2 s grace period: Error, 137. The target stays healthy
	// for 6 s, longer than a probe that always fails would take to kill
	// (1 s delay + 3 failures), which would then signal before "unhealthy".
	// A trapped signal interrupts wait at once, where sh would finish a
	// foreground sleep first. The timeout is generous: a probe held up by
	// a busy machine is not what this test is about. The healthy 6 s
	// count from when the server listens, and a startup probe holds the
	// liveness probe until then: a failure against a server not yet
	// listening would start the count of failures early (the kubelet
	// counts it too, and a success resets the streak).
	// Only the first run turns unhealthy (its mark outlives it in an
	// emptyDir): on a busy machine the test may look only after a second
	// run would have been killed too, and with the crash backoff then.
	script := "trap 'echo term' TERM; echo start; touch /tmp/healthy; " + probeServer + probeServerListening +
		"[ -e /runs/first ] || { touch /runs/first; sleep 6 & wait $!; rm /tmp/healthy; }; while :; do sleep 0.1; done"
	for kind, handler := range probeHandlers {
		n.writeManifest("live-"+kind+".yaml", probedPod("live-"+kind, script, `    startupProbe:
      `+handler+`
      periodSeconds: 1
      timeoutSeconds: 5
      failureThreshold: 120
    livenessProbe:
      `+handler+`
      initialDelaySeconds: 1
      periodSeconds: 1
      timeoutSeconds: 5
      failureThreshold: 3
    volumeMounts: [{name: runs, mountPath: /runs}]
  volumes: [{name: runs, emptyDir: {}}]
`))
	}
	for kind := range probeHandlers {
		name := "live-" + kind
		p := n.waitPodFor(name, "restarted by its liveness probe", 90*time.Second, func(p *v1.Pod) bool {
			cs := containerStatus(p, "main")
			return cs != nil && cs.RestartCount >= 1 && cs.LastTerminationState.Terminated != nil && cs.State.Running != nil
		})
		cs := containerStatus(p, "main")
		if cs.RestartCount != 1 {
			t.Errorf("%s: restartCount %d at the first restart, want 1", kind, cs.RestartCount)
		}
		last := cs.LastTerminationState.Terminated
		if last.Reason != "Error" || last.ExitCode != 137 {
			t.Errorf("%s: lastState %s/%d, want Error/137", kind, last.Reason, last.ExitCode)
		}
		evs := n.events(name)
		// Which results killed it: the kubelet records each failed attempt
		// and holds the probe while the container is killed, so three
		// failures mean the third killed, not the first.
		if got := eventCount(evs, "Unhealthy", "Liveness probe failed:"); got != 3 {
			t.Errorf("%s: %d Unhealthy liveness events, want 3 (one per failure up to the threshold):%s", kind, got, eventsText(evs))
		}
		unhealthyEv := findEvent(evs, "Unhealthy", "Liveness probe failed:")
		killing := findEvent(evs, "Killing", "Container main failed liveness probe, will be restarted")
		if killing == nil {
			t.Errorf("%s: no Killing event:%s", kind, eventsText(evs))
		} else if unhealthyEv != nil && killing.FirstTimestamp.Before(&unhealthyEv.LastTimestamp) {
			t.Errorf("%s: Killing before the last failure it follows from:%s", kind, eventsText(evs))
		}
		// The first run has ended: its log is complete.
		unhealthy, okU := n.firstLine(p, "main", 0, "unhealthy")
		term, okT := n.firstLine(p, "main", 0, "term")
		if !okU || !okT {
			t.Errorf("%s: the first run logged unhealthy %t, SIGTERM %t; want both", kind, okU, okT)
			continue
		}
		if term.Before(unhealthy) {
			t.Errorf("%s: SIGTERM came %s before the target turned unhealthy: its probe failed against a healthy target:%s",
				kind, unhealthy.Sub(term).Round(time.Millisecond), eventsText(evs))
			continue
		}
		// SIGKILL only at the end of the 2 s grace: the next run cannot
		// start sooner after SIGTERM (a busy machine only adds to this).
		restarted := n.lineTimes(p, "main", 1, "start")[0]
		if d := restarted.Sub(term); d < 1800*time.Millisecond {
			t.Errorf("%s: next run %s after SIGTERM, want at least the 2 s grace period", kind, d.Round(time.Millisecond))
		}
		// The first restart comes at once (the crash backoff starts with
		// the second), by noderun's own times of the exit and the new
		// run's start, whole seconds: a 10 s backoff would show 9 s or more.
		if gap := cs.State.Running.StartedAt.Sub(last.FinishedAt.Time); gap > 7*time.Second {
			t.Errorf("%s: the first restart started %s after the kill ended the run, want at once (no backoff)", kind, gap)
		}
	}
}

// findEvent returns the first event with reason whose message starts with
// prefix, or nil.
func findEvent(evs []v1.Event, reason, prefix string) *v1.Event {
	for i := range evs {
		if evs[i].Reason == reason && strings.HasPrefix(evs[i].Message, prefix) {
			return &evs[i]
		}
	}
	return nil
}

// readyChange is a change of a pod's Ready condition as the test saw it,
// with noderun's counts of the readiness probe's results read just after.
type readyChange struct {
	ready  bool
	counts map[string]int
	pod    *v1.Pod
}

// TestLifecycleReadinessFlips: Ready follows each kind of readiness probe
// both ways, after successThreshold or failureThreshold probes in a row,
// never before the first success, and never restarts anything. Each flip is
// checked against noderun's count of the probe's results (read after the
// status, so it holds every result the status acted on) and dated by the
// condition's lastTransitionTime, not by when the test saw it.
func TestLifecycleReadinessFlips(t *testing.T) {
	t.Parallel()
	n := newNodeWithImages(t, []string{probeServerTar(t)})
	// probeserver prints unhealthy (at its start), healthy, unhealthy,
	// healthy as the script flips the file.
	// The flips wait for the server to listen: it prints the file's state
	// when it starts, which on a busy machine came after a fixed sleep's
	// first flip (healthy, unhealthy, healthy were logged).
	script := "trap 'exit 0' TERM; " + probeServer + probeServerListening +
		"sleep 2; touch /tmp/healthy; sleep 5; rm /tmp/healthy; sleep 5; touch /tmp/healthy; while :; do sleep 0.1; done"
	for kind, handler := range probeHandlers {
		n.writeManifest("ready-"+kind+".yaml", probedPod("ready-"+kind, script, `    readinessProbe:
      `+handler+`
      periodSeconds: 1
      timeoutSeconds: 5
      successThreshold: 3
      failureThreshold: 3
`))
	}
	metrics := n.metricsReader()
	changes := map[string][]readyChange{}
	done := func() bool {
		for kind := range probeHandlers {
			if len(changes[kind]) < 4 {
				return false
			}
		}
		return true
	}
	for deadline := time.Now().Add(2 * time.Minute); !done() && time.Now().Before(deadline); time.Sleep(pollEvery / 2) {
		var changed []string
		for _, p := range n.pods() {
			kind := strings.TrimSuffix(strings.TrimPrefix(p.Name, "ready-"), "-"+nodeName)
			if _, ok := probeHandlers[kind]; !ok || !running(&p) {
				continue
			}
			cs := containerStatus(&p, "main")
			ready := podCondition(&p, v1.PodReady)
			if ready != cs.Ready || ready != podCondition(&p, v1.ContainersReady) {
				t.Fatalf("%s: container ready %t, Ready %t, ContainersReady %t disagree", kind, cs.Ready, ready, podCondition(&p, v1.ContainersReady))
			}
			if cs.RestartCount != 0 {
				t.Fatalf("%s: readiness restarted the container", kind)
			}
			if c := changes[kind]; len(c) == 0 || c[len(c)-1].ready != ready {
				changes[kind] = append(c, readyChange{ready: ready, pod: &p})
				changed = append(changed, kind)
			}
		}
		if len(changed) > 0 {
			m := metrics.read()
			for _, kind := range changed {
				changes[kind][len(changes[kind])-1].counts = probeCounts(t, m, "ready-"+kind, "main", "Readiness")
			}
		}
	}
	for kind := range probeHandlers {
		c := changes[kind]
		var seen []bool
		for _, ch := range c {
			seen = append(seen, ch.ready)
		}
		if want := []bool{false, true, false, true}; !slices.Equal(seen, want) {
			t.Errorf("%s: Ready went %v, want %v; events: %+v", kind, seen, want, eventsText(n.events("ready-"+kind)))
			continue
		}
		// Three results in a row of the new kind since the last flip: the
		// target was unhealthy before its first healthy phase, healthy
		// only in between.
		if got := c[1].counts["successful"]; got < 3 {
			t.Errorf("%s: Ready after %d successful probes, want at least 3 (successThreshold)", kind, got)
		}
		if got := c[2].counts["failed"] - c[1].counts["failed"]; got < 3 {
			t.Errorf("%s: not Ready after %d failed probes, want at least 3 (failureThreshold)", kind, got)
		}
		if got := c[3].counts["successful"] - c[2].counts["successful"]; got < 3 {
			t.Errorf("%s: Ready again after %d successful probes, want at least 3 (successThreshold)", kind, got)
		}
		healthy := n.lineTimes(c[3].pod, "main", 0, "healthy")
		unhealthy := n.lineTimes(c[3].pod, "main", 0, "unhealthy")
		if len(healthy) != 2 || len(unhealthy) != 2 {
			t.Fatalf("%s: probeserver logged %d healthy and %d unhealthy, want 2 and 2", kind, len(healthy), len(unhealthy))
		}
		// Not never: each flip follows the change of health within a few
		// periods, by the condition's lastTransitionTime (whole seconds).
		// Three probes in a row take 2-3 s; the bound is generous.
		for i, from := range []time.Time{healthy[0], unhealthy[1], healthy[1]} {
			at := condition(c[i+1].pod, v1.PodReady).LastTransitionTime.Time
			if d := at.Sub(from.Truncate(time.Second)); d < 0 || d > 15*time.Second {
				t.Errorf("%s: Ready %t at %s, %s after the target's health changed at %s; want after, within a few probe periods",
					kind, c[i+1].ready, at.Format(time.TimeOnly), d, from.Format("15:04:05.000"))
			}
		}
	}
	if !hasEvent(n.events("ready-http"), "Unhealthy", "Readiness probe failed: HTTP probe failed with statuscode: 503") {
		t.Errorf("no Unhealthy readiness event for the HTTP probe:%s", eventsText(n.events("ready-http")))
	}
	// The engine's runtime calls are measured under the kubelet's names
	// (runner.Config.Metrics). Whether a container was created ahead of
	// its start (create_container) depends on its image being at hand
	// when the pod came: runner's unit tests check that path.
	m := metrics.read()
	for _, op := range []string{"start_container", "exec_sync"} {
		if series := `kubelet_runtime_operations_duration_seconds_count{operation_type="` + op + `"}`; !strings.Contains(m, series) {
			t.Errorf("/metrics has no %s: %s", series, grepLines(m, "kubelet_runtime_operations_duration_seconds_count"))
		}
	}
}

// TestLifecycleStartupProbeHoldsLiveness: a liveness probe that would fail
// at once waits until the startup probe succeeded; started and ready stay
// false until then.
func TestLifecycleStartupProbeHoldsLiveness(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("slow.yaml", `apiVersion: v1
kind: Pod
metadata:
  name: slow
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", "trap 'exit 0' TERM; sleep 4; touch /tmp/up; echo up; while :; do sleep 0.1; done"]
    startupProbe:
      exec: {command: ["cat", "/tmp/up"]}
      periodSeconds: 1
      failureThreshold: 20
    livenessProbe:
      exec: {command: ["cat", "/tmp/up"]}
      periodSeconds: 1
      failureThreshold: 1
`)
	sawNotStarted := false
	p := n.waitPodFor("slow", "started", 20*time.Second, func(p *v1.Pod) bool {
		cs := containerStatus(p, "main")
		if cs == nil || cs.State.Running == nil {
			return false
		}
		started := cs.Started != nil && *cs.Started
		if !started {
			sawNotStarted = true
			if cs.Ready || podCondition(p, v1.PodReady) {
				t.Fatalf("ready before the startup probe succeeded: %s", statusJSON(p))
			}
		}
		return started
	})
	startedSeen := time.Now()
	if !sawNotStarted {
		t.Errorf("never saw started false while the startup probe was failing")
	}
	if cs := containerStatus(p, "main"); !cs.Ready {
		t.Errorf("started but not ready; with no readiness probe it is ready once started")
	}
	up := n.lineTimes(p, "main", 0, "up")[0]
	// Started only once /tmp/up exists (the log line comes just after the
	// file, so a little before it is fine), and then by the next probe:
	// within a period, which only a generous bound can check on a busy
	// machine.
	checkTiming(t, "file created -> started seen", startedSeen.Sub(up), -200*time.Millisecond, 15*time.Second,
		"the next startup probe, within 1 s")
	time.Sleep(3 * time.Second)
	if cs := containerStatus(n.pod("slow"), "main"); cs.RestartCount != 0 {
		t.Fatalf("restarted %d times: liveness ran before the startup probe passed", cs.RestartCount)
	}
	evs := n.events("slow")
	if !hasEvent(evs, "Unhealthy", "Startup probe failed:") || hasEvent(evs, "Unhealthy", "Liveness probe failed:") {
		t.Errorf("want Unhealthy events of the startup probe and none of liveness:%s", eventsText(evs))
	}
}

// TestLifecycleExecProbeTimeout: an exec probe past timeoutSeconds fails
// and its process is killed at the timeout; as a liveness probe it
// restarts the container.
func TestLifecycleExecProbeTimeout(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	pod := func(name, probe string) string {
		return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: busybox:1.36
    command: ["sleep", "3600"]
    %s:
      exec: {command: ["sleep", "30"]}
      timeoutSeconds: 1
      periodSeconds: 3
      failureThreshold: 2
`, name, probe)
	}
	n.writeManifest("hang.yaml", pod("hang", "readinessProbe"))
	n.writeManifest("hang-live.yaml", pod("hang-live", "livenessProbe"))
	n.waitPod("hang", "running", running)
	deadline := time.Now().Add(20 * time.Second)
	for !hasEvent(n.events("hang"), "Unhealthy", `Readiness probe failed: command timed out: "sleep 30" timed out after 1s`) {
		if time.Now().After(deadline) {
			t.Fatalf("no timed-out probe event:%s", eventsText(n.events("hang")))
		}
		time.Sleep(pollEvery)
	}
	p := n.waitPodFor("hang-live", "restarted by its timed-out liveness probe", 30*time.Second, func(p *v1.Pod) bool {
		cs := containerStatus(p, "main")
		return cs.RestartCount >= 1 && cs.LastTerminationState.Terminated != nil
	})
	if last := containerStatus(p, "main").LastTerminationState.Terminated; last.Reason != "Error" || last.ExitCode != 137 {
		t.Errorf("liveness: lastState %s/%d, want Error/137 (sleep as PID 1 ignores SIGTERM)", last.Reason, last.ExitCode)
	}
	if evs := n.events("hang-live"); !hasEvent(evs, "Unhealthy", `Liveness probe failed: command timed out: "sleep 30" timed out after 1s`) {
		t.Errorf("no timed-out liveness event:%s", eventsText(evs))
	}
	// Each probe's sleep is killed at its 1 s timeout: however long the
	// probes go on, none may be older than that (and a little).
	for range 3 {
		for _, name := range []string{"hang", "hang-live"} {
			pids := n.podPIDs(n.pod(name))
			if len(pids) == 0 {
				t.Fatalf("%s: no processes found in the pod", name)
			}
			for _, pid := range pids {
				cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
				if age := procAge(t, pid); string(cmd) == "sleep\x0030\x00" && age > 1500*time.Millisecond {
					t.Errorf("%s: probe process %d (sleep 30) still runs %s after it started; the timeout is 1 s", name, pid, age)
				}
			}
		}
		time.Sleep(time.Second)
	}
	if p := n.pod("hang"); podCondition(p, v1.PodReady) {
		t.Error("Ready although every readiness probe timed out")
	}
}

// podPIDs lists the host PIDs of the processes in the pod's running
// containers, exec'd ones included (containerd lists the cgroup's).
func (n *node) podPIDs(p *v1.Pod) []int {
	n.t.Helper()
	var out []int
	for _, c := range n.containers(string(p.UID)) {
		ctr, err := client.LoadContainer(n.ctx(), c.ID)
		if err != nil {
			n.t.Fatal(err)
		}
		task, err := ctr.Task(n.ctx(), nil)
		if errdefs.IsNotFound(err) {
			continue // between runs
		}
		if err != nil {
			n.t.Fatal(err)
		}
		if st, err := task.Status(n.ctx()); err != nil || st.Status != containerd.Running {
			continue // ended
		}
		pids, err := task.Pids(n.ctx())
		if err != nil {
			n.t.Fatalf("pids of %s: %v", c.ID, err)
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
  terminationGracePeriodSeconds: 1
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
		t.Errorf("no FailedPostStartHook event:%s", eventsText(n.events("badhook")))
	}
}

// waitAllGone waits until none of the pods is listed and returns when
// each went, as seen by polling them all together.
func (n *node) waitAllGone(timeout time.Duration, names ...string) map[string]time.Time {
	n.t.Helper()
	gone := map[string]time.Time{}
	for deadline := time.Now().Add(timeout); len(gone) < len(names); time.Sleep(pollEvery / 2) {
		if time.Now().After(deadline) {
			n.t.Fatalf("pods still listed after %s; gone: %v of %v", timeout, gone, names)
		}
		listed := map[string]bool{}
		for _, p := range n.pods() {
			listed[p.Name] = true
		}
		for _, name := range names {
			if _, ok := gone[name]; !ok && !listed[name+"-"+nodeName] {
				gone[name] = time.Now()
			}
		}
	}
	return gone
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
// grace period; what it uses is gone from the signal's share, but the
// kubelet always leaves at least 2 s between SIGTERM and SIGKILL.
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
    command: ["sh", "-c", "trap 'echo term $(cut -d\" \" -f1 /proc/uptime) >> /out/drain; exit 0' TERM; while :; do sleep 0.1; done"]
    volumeMounts: [{name: out, mountPath: /out}]
    lifecycle:
      preStop:
        exec: {command: ["sh", "-c", "echo prestop $(cut -d' ' -f1 /proc/uptime) >> /out/drain; sleep 3"]}
  volumes:
  - {name: out, hostPath: {path: %s}}
`, dir))
	// These note SIGTERM and carry on, so SIGKILL at the end of what is
	// left of the grace period ends them; containerd dates that exit.
	stubborn := []struct {
		name, grace, lifecycle string
		preStop                time.Duration // removal -> SIGTERM
		killed                 time.Duration // removal -> SIGKILL
		kubelet                string
	}{
		{"stubborn", "5", "{preStop: {sleep: {seconds: 3}}}", 3 * time.Second, 5 * time.Second, "3 s of preStop, then the 2 s left of the 5 s grace"},
		{"late", "5", "{preStop: {sleep: {seconds: 4}}}", 4 * time.Second, 6 * time.Second, "4 s of preStop, then 1 s left, raised to the 2 s minimum"},
		{"brief", "1", "{}", 0, 2 * time.Second, "no preStop, the 1 s grace raised to the 2 s minimum"},
	}
	for _, s := range stubborn {
		n.writeManifest(s.name+".yaml", fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
spec:
  terminationGracePeriodSeconds: %s
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", "trap 'echo term $(cut -d\" \" -f1 /proc/uptime) >> /out/%s' TERM; while :; do sleep 0.1 & wait; done"]
    volumeMounts: [{name: out, mountPath: /out}]
    lifecycle: %s
  volumes:
  - {name: out, hostPath: {path: %s}}
`, s.name, s.grace, s.name, s.lifecycle, dir))
	}
	n.waitPod("drain", "running", running)
	ids := map[string]string{}
	for _, s := range stubborn {
		ids[s.name] = containerID(n.waitPod(s.name, "running", running).Status.ContainerStatuses[0])
	}
	exits := n.watchExits()
	removed, removedUp := time.Now(), hostUptime(t)
	n.removeManifest("drain.yaml")
	for _, s := range stubborn {
		n.removeManifest(s.name + ".yaml")
	}
	n.waitAllGone(time.Minute, "drain", "stubborn", "late", "brief")
	for _, s := range stubborn {
		up := uptimeLog(t, filepath.Join(dir, s.name))["term"]
		exit, ok := exits.at(ids[s.name])
		if up == 0 || !ok {
			t.Errorf("%s: SIGTERM noted at uptime %.2f, exit seen %t: want both", s.name, up, ok)
			continue
		}
		// SIGTERM only once the preStop hook is done, SIGKILL only once
		// the grace period (what the hook left of it, at least 2 s) is
		// over; both counted from the removal, which comes before noderun
		// starts the kill, so a busy machine only makes them later. The
		// trap notes SIGTERM late on a busy machine, so SIGTERM -> SIGKILL
		// is not measured on its own. The upper bounds only say "then".
		term := removed.Add(time.Duration((up - removedUp) * float64(time.Second)))
		checkTiming(t, s.name+": removal -> SIGTERM", term.Sub(removed), s.preStop-200*time.Millisecond, s.preStop+10*time.Second, s.kubelet)
		checkTiming(t, s.name+": removal -> SIGKILL", exit.Sub(removed), s.killed-200*time.Millisecond, s.killed+10*time.Second, s.kubelet)
		if exit.Before(term) {
			t.Errorf("%s: the exit came before SIGTERM was noted", s.name)
		}
	}
	log := uptimeLog(t, filepath.Join(dir, "drain"))
	pre, term := log["prestop"], log["term"]
	if pre == 0 || term == 0 {
		t.Fatalf("preStop at %.2f, SIGTERM at %.2f (uptimes): one is missing", pre, term)
	}
	checkTiming(t, "drain: preStop began -> SIGTERM", time.Duration((term-pre)*float64(time.Second)),
		2800*time.Millisecond, 15*time.Second, "when the 3 s hook has returned")
}

// hostUptime is the host's /proc/uptime, the clock containers can log.
func hostUptime(t *testing.T) float64 {
	t.Helper()
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		t.Fatal(err)
	}
	up, err := strconv.ParseFloat(strings.Fields(string(b))[0], 64)
	if err != nil {
		t.Fatal(err)
	}
	return up
}

// exitWatch holds when containers' main processes exited, as containerd's
// /tasks/exit events date it.
type exitWatch struct {
	mu   sync.Mutex
	exit map[string]time.Time // container ID -> exit
}

// watchExits subscribes to the node's task exits until the test ends.
func (n *node) watchExits() *exitWatch {
	ctx, cancel := context.WithCancel(n.ctx())
	n.t.Cleanup(cancel)
	w := &exitWatch{exit: map[string]time.Time{}}
	envs, errs := client.Subscribe(ctx, `topic=="/tasks/exit"`)
	go func() {
		for {
			select {
			case env := <-envs:
				v, err := typeurl.UnmarshalAny(env.Event)
				if e, ok := v.(*apievents.TaskExit); err == nil && ok && env.Namespace == n.ns && e.ID == e.ContainerID {
					w.mu.Lock()
					w.exit[e.ContainerID] = e.ExitedAt.AsTime()
					w.mu.Unlock()
				}
			case <-errs:
				return
			}
		}
	}()
	return w
}

// at returns when the container exited, waiting a little for the event.
func (w *exitWatch) at(id string) (time.Time, bool) {
	for range 20 {
		w.mu.Lock()
		t, ok := w.exit[id]
		w.mu.Unlock()
		if ok {
			return t, true
		}
		time.Sleep(pollEvery)
	}
	return time.Time{}, false
}

// TestLifecycleSidecar: a restartable init container starts first, and the
// app container only once its startup probe passed; its readiness counts
// for the pod's; it is restarted with the crash backoff when it exits, and
// stopped after the app; a pod whose app containers completed ends
// Succeeded although its sidecar was running.
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
    command: ["sh", "-c", "trap 'echo proxy-term $(cut -d\" \" -f1 /proc/uptime) >> /out/log; sleep 0.5; exit 0' TERM; echo proxy-start; sleep 2; touch /tmp/up; echo proxy-up; sleep 3; touch /tmp/ready; echo proxy-ready; while :; do sleep 0.1; done"]
    volumeMounts: [{name: out, mountPath: /out}]
    startupProbe:
      exec: {command: ["cat", "/tmp/up"]}
      periodSeconds: 1
      failureThreshold: 30
    readinessProbe:
      exec: {command: ["cat", "/tmp/ready"]}
      periodSeconds: 1
  containers:
  - name: app
    image: busybox:1.36
    command: ["sh", "-c", "trap 'echo app-term $(cut -d\" \" -f1 /proc/uptime) >> /out/log; exit 0' TERM; echo app-start; while :; do sleep 0.1; done"]
    volumeMounts: [{name: out, mountPath: /out}]
  volumes:
  - {name: out, hostPath: {path: %s}}
`, dir))
	n.writeManifest("flaky.yaml", `apiVersion: v1
kind: Pod
metadata:
  name: flaky
spec:
  terminationGracePeriodSeconds: 2
  initContainers:
  - name: proxy
    image: busybox:1.36
    restartPolicy: Always
    command: ["sh", "-c", "echo proxy-start; sleep 1; exit 1"]
  containers:
  - name: app
    image: busybox:1.36
    command: ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 0.1; done"]
`)
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

	sawAppWithUnreadyProxy := false
	p := n.waitPod("side", "Ready", func(p *v1.Pod) bool {
		proxy, app := containerStatus(p, "proxy"), containerStatus(p, "app")
		if proxy != nil && app != nil && app.State.Running != nil && !proxy.Ready {
			sawAppWithUnreadyProxy = true
			if podCondition(p, v1.PodReady) {
				t.Fatalf("pod Ready while its sidecar is not: %s", statusJSON(p))
			}
		}
		return podCondition(p, v1.PodReady)
	})
	readyAt := time.Now()
	proxy, app := containerStatus(p, "proxy"), containerStatus(p, "app")
	if proxy.State.Running == nil || !proxy.Ready || proxy.Started == nil || !*proxy.Started || app.State.Running == nil || !podCondition(p, v1.PodInitialized) {
		t.Fatalf("sidecar %+v app %+v: both must run, the sidecar started and ready, the pod initialized", proxy, app.State)
	}
	if !sawAppWithUnreadyProxy {
		t.Errorf("never saw the app running beside a sidecar that was not ready yet")
	}
	proxyUp := n.lineTimes(p, "proxy", 0, "proxy-up")[0]
	proxyReady := n.lineTimes(p, "proxy", 0, "proxy-ready")[0]
	appStart := n.lineTimes(p, "app", 0, "app-start")[0]
	// The order is the behaviour; the upper bounds only say "then", and
	// are generous for a busy machine.
	checkTiming(t, "sidecar's startup probe can pass -> app starts", appStart.Sub(proxyUp), 0, 15*time.Second,
		"the next startup probe within 1 s, then the app container")
	checkTiming(t, "sidecar's readiness file -> pod Ready seen", readyAt.Sub(proxyReady), -200*time.Millisecond, 15*time.Second,
		"the next readiness probe within 1 s")

	n.removeManifest("side.yaml")
	n.waitGone("side", 30*time.Second)
	log := uptimeLog(t, filepath.Join(dir, "log"))
	if log["app-term"] == 0 || log["proxy-term"] == 0 || log["proxy-term"] < log["app-term"] {
		t.Errorf("app TERM at %.2f, sidecar TERM at %.2f: the sidecar must be stopped after the app", log["app-term"], log["proxy-term"])
	}

	p = n.waitPodFor("job", "Succeeded", 30*time.Second, func(p *v1.Pod) bool { return p.Status.Phase == v1.PodSucceeded })
	if cs := containerStatus(p, "work"); cs.State.Terminated == nil || cs.State.Terminated.Reason != "Completed" {
		t.Errorf("work: %+v", cs.State)
	}
	n.waitPodFor("job", "sidecar stopped", 10*time.Second, func(p *v1.Pod) bool {
		return containerStatus(p, "proxy").State.Running == nil
	})

	sawBackOff := false
	p = n.waitPodFor("flaky", "its sidecar restarted twice", 40*time.Second, func(p *v1.Pod) bool {
		proxy, app := containerStatus(p, "proxy"), containerStatus(p, "app")
		if proxy == nil {
			return false
		}
		if w := proxy.State.Waiting; w != nil && w.Reason == "CrashLoopBackOff" {
			sawBackOff = true
		}
		if app != nil && app.RestartCount != 0 {
			t.Fatalf("the app container restarted with its sidecar: %s", statusJSON(p))
		}
		return proxy.RestartCount >= 2
	})
	if !sawBackOff {
		t.Errorf("never saw the sidecar waiting in CrashLoopBackOff")
	}
	if app := containerStatus(p, "app"); app.State.Running == nil || p.Status.Phase != v1.PodRunning {
		t.Errorf("app %+v, phase %s: the app keeps running while its sidecar crashes", app.State, p.Status.Phase)
	}
	runs := []time.Time{n.lineTimes(p, "proxy", 1, "proxy-start")[0], n.lineTimes(p, "proxy", 2, "proxy-start")[0]}
	checkTiming(t, "sidecar's second restart after the first", runs[1].Sub(runs[0]), 10*time.Second, 40*time.Second,
		"its 1 s run, then the 10 s crash backoff")
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

// TestLifecycleOOMKilledCgroupGone: an OOM kill whose TaskOOM event
// noderun missed (it was down) and whose container cgroup is gone by the
// time noderun looks (as systemd removes an emptied scope at once) is still
// reported OOMKilled, from the kernel's log.
func TestLifecycleOOMKilledCgroupGone(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	dir := t.TempDir()
	n.writeManifest("hog.yaml", fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: hog
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", "until [ -e /go/now ]; do sleep 0.1; done; exec tail /dev/zero"]
    volumeMounts: [{name: go, mountPath: /go}]
    resources:
      limits: {memory: 32Mi}
  volumes:
  - {name: go, hostPath: {path: %s}}
`, dir))
	id := containerID(*containerStatus(n.waitPod("hog", "Running", running), "main"))
	c, err := client.LoadContainer(n.ctx(), id)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := c.Spec(n.ctx())
	if err != nil {
		t.Fatal(err)
	}
	memcg := filepath.Join("/sys/fs/cgroup", spec.Linux.CgroupsPath)
	if !unified {
		memcg = filepath.Join("/sys/fs/cgroup/memory", spec.Linux.CgroupsPath)
	}
	n.kill9()
	if err := os.WriteFile(filepath.Join(dir, "now"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the container killed", func() bool { return n.task(id).Status == tasktypes.Status_STOPPED })
	if code := n.task(id).ExitStatus; code != 137 {
		t.Fatalf("exit status %d, want 137 (an OOM kill)", code)
	}
	if err := os.Remove(memcg); err != nil {
		t.Fatalf("remove the container's memory cgroup, as systemd removes its scope: %v", err)
	}
	n.start()
	p := n.waitPod("hog", "Failed", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodFailed })
	if term := containerStatus(p, "main").State.Terminated; term == nil || term.Reason != "OOMKilled" || term.ExitCode != 137 {
		t.Fatalf("terminated %+v, want OOMKilled/137", term)
	}
}

// TestLifecycleTerminationMessage: the file, a custom path, and the log
// fallback fill state.terminated.message within the kubelet's limits (the
// file's last 4 KiB; the log's last 80 lines and 2 KiB); each run gets an
// empty file, and the last run's message stays in lastState.
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
  - name: big
    image: busybox:1.36
    command: ["sh", "-c", "head -c 1000 /dev/zero | tr '\\0' a > /dev/termination-log; head -c 4096 /dev/zero | tr '\\0' b >> /dev/termination-log"]
  - name: logs
    image: busybox:1.36
    terminationMessagePolicy: FallbackToLogsOnError
    command: ["sh", "-c", "echo first; sleep 0.3; echo last >&2; exit 1"]
  - name: many
    image: busybox:1.36
    terminationMessagePolicy: FallbackToLogsOnError
    command: ["sh", "-c", "for i in $(seq 1 100); do echo line $i; done; exit 1"]
  - name: wide
    image: busybox:1.36
    terminationMessagePolicy: FallbackToLogsOnError
    command: ["sh", "-c", "x=$(head -c 98 /dev/zero | tr '\\0' x); for i in $(seq 10 49); do echo $i$x; done; exit 1"]
`)
	n.writeManifest("again.yaml", `apiVersion: v1
kind: Pod
metadata:
  name: again
spec:
  restartPolicy: OnFailure
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", "echo \"prev=[$(cat /dev/termination-log)]\"; printf gone > /dev/termination-log; exit 2"]
`)
	var many, wide strings.Builder
	for i := 21; i <= 100; i++ {
		fmt.Fprintf(&many, "line %d\n", i)
	}
	for i := 10; i <= 49; i++ {
		fmt.Fprintf(&wide, "%d%s\n", i, strings.Repeat("x", 98))
	}
	want := map[string]string{
		"file":   "disk full",
		"custom": "done",
		"big":    strings.Repeat("b", 4096),
		"logs":   "first\nlast\n",
		"many":   many.String(),
		"wide":   wide.String()[wide.Len()-2048:],
	}
	p := n.waitPodFor("msg", "Failed", 30*time.Second, func(p *v1.Pod) bool { return p.Status.Phase == v1.PodFailed })
	for name, want := range want {
		term := containerStatus(p, name).State.Terminated
		if term == nil {
			t.Errorf("%s: not terminated: %+v", name, containerStatus(p, name).State)
		} else if term.Message != want {
			t.Errorf("%s: message %s, want %s", name, abbrev(term.Message), abbrev(want))
		}
	}

	p = n.waitPodFor("again", "restarted", 30*time.Second, func(p *v1.Pod) bool {
		cs := containerStatus(p, "main")
		return cs.RestartCount >= 1 && cs.LastTerminationState.Terminated != nil
	})
	if last := containerStatus(p, "main").LastTerminationState.Terminated; last.Message != "gone" || last.ExitCode != 2 {
		t.Errorf("lastState.terminated: message %q exit %d, want %q and 2", last.Message, last.ExitCode, "gone")
	}
	n.waitLogLine(n.logPath(p, "main", 1), "prev=[]")
}

// abbrev quotes s, with only its ends when it is long.
func abbrev(s string) string {
	if len(s) <= 100 {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%q...%q (%d bytes)", s[:40], s[len(s)-40:], len(s))
}

// TestLifecycleActiveDeadline: the pod fails with DeadlineExceeded soon
// after its deadline, and its containers are stopped. When is noderun's
// record: the pod's startTime and the event's time.
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
	p := n.waitPodFor("late", "Failed", time.Minute, func(p *v1.Pod) bool { return p.Status.Phase == v1.PodFailed })
	evs := n.events("late")
	ev := findEvent(evs, "DeadlineExceeded", "Pod was active on the node longer than the specified deadline")
	if ev == nil || p.Status.StartTime == nil {
		t.Fatalf("startTime %v; no DeadlineExceeded event:%s", p.Status.StartTime, eventsText(evs))
	}
	// The deadline counts from startTime; the kubelet checks it every
	// second. Both times are whole seconds, so 3 s or more after is exact:
	// never before the deadline. The upper bound only says "soon".
	if d := ev.FirstTimestamp.Sub(p.Status.StartTime.Time); d < 3*time.Second || d > 15*time.Second {
		t.Errorf("DeadlineExceeded %s after startTime, want at the 3 s deadline or soon after", d)
	}
	if p.Status.Reason != "DeadlineExceeded" || p.Status.Message != "Pod was active on the node longer than the specified deadline" {
		t.Errorf("reason %q message %q, want the kubelet's DeadlineExceeded", p.Status.Reason, p.Status.Message)
	}
	p = n.waitPodFor("late", "stopped", 30*time.Second, func(p *v1.Pod) bool { return containerStatus(p, "main").State.Terminated != nil })
	if cs := containerStatus(p, "main"); cs.RestartCount != 0 || p.Status.Phase != v1.PodFailed {
		t.Errorf("after the deadline: restarts %d, phase %s; want nothing started again", cs.RestartCount, p.Status.Phase)
	}
	for _, task := range n.tasks() {
		if task.Status == tasktypes.Status_RUNNING {
			t.Errorf("task %s still runs after the deadline", task.ID)
		}
	}
}

// TestLifecycleStartError: a command that does not exist ends the run with
// StartError and exit code 128, as under containerd's CRI, and with
// restartPolicy Always goes into the crash backoff.
func TestLifecycleStartError(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	pod := func(name, policy string) string {
		return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
spec:
  restartPolicy: %s
  containers:
  - name: main
    image: busybox:1.36
    command: ["/no/such/binary"]
`, name, policy)
	}
	n.writeManifest("nocmd.yaml", pod("nocmd", "Never"))
	n.writeManifest("nocmd-always.yaml", pod("nocmd-always", "Always"))
	startError := func(term *v1.ContainerStateTerminated) bool {
		return term != nil && term.Reason == "StartError" && term.ExitCode == 128 && strings.Contains(term.Message, "/no/such/binary")
	}
	p := n.waitPodFor("nocmd", "Failed", 20*time.Second, func(p *v1.Pod) bool { return p.Status.Phase == v1.PodFailed })
	if term := containerStatus(p, "main").State.Terminated; !startError(term) {
		t.Errorf("terminated %+v, want StartError/128 naming the binary", term)
	}
	p = n.waitPodFor("nocmd-always", "in CrashLoopBackOff", 20*time.Second, func(p *v1.Pod) bool {
		cs := containerStatus(p, "main")
		return cs.State.Waiting != nil && cs.State.Waiting.Reason == "CrashLoopBackOff"
	})
	if cs := containerStatus(p, "main"); cs.RestartCount < 1 || !startError(cs.LastTerminationState.Terminated) {
		t.Errorf("restarts %d, lastState %+v; want StartError/128 naming the binary", cs.RestartCount, cs.LastTerminationState.Terminated)
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
