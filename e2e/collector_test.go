package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/crilog"
	"github.com/noderun/noderun/internal/testnode"
)

// collectorPIDs finds the node's log collectors by their command line.
func (n *node) collectorPIDs() []int {
	return testnode.CollectorPIDs(noderunBin, n.run)
}

// collectorPID is the node's log collector; 0 when none runs.
func (n *node) collectorPID() int {
	if pids := n.collectorPIDs(); len(pids) > 0 {
		return pids[0]
	}
	return 0
}

func (n *node) collectors() int { return len(n.collectorPIDs()) }

// logStream reads, from GET /logs, the collector's count of dropped
// records for the log at path.
func (n *node) logStream(path string) (crilog.StreamStats, error) {
	var all []crilog.StreamStats
	if err := n.get("/logs", &all); err != nil {
		return crilog.StreamStats{}, err
	}
	for _, s := range all {
		if s.Path == path {
			return s, nil
		}
	}
	return crilog.StreamStats{}, fmt.Errorf("no stream for %s in %+v", path, all)
}

// numbered reads "line N" records and says which numbers are there.
func numbered(lines []logLine) (seen map[int]bool, last int) {
	seen = map[int]bool{}
	for _, l := range lines {
		if f := strings.Fields(l.content); len(f) > 1 && f[0] == "line" {
			if i, err := strconv.Atoi(f[1]); err == nil {
				seen[i] = true
				last = max(last, i)
			}
		}
	}
	return seen, last
}

const counterPod = `apiVersion: v1
kind: Pod
metadata: {name: counter}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", "trap 'exit 0' TERM; i=0; while :; do i=$((i+1)); echo line $i; sleep 0.02 & wait; done"]
`

// A kill -9 of the collector loses no line the container writes after a
// new one is back, and neither kills nor stops the container: noderun
// holds the pipes' read ends too, starts a new collector and hands them
// over.
func TestLogCollectorKill9(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("counter.yaml", counterPod)
	p := n.waitPod("counter", "Running", running)
	path := n.logPath(p, "main", 0)
	n.waitLogLine(path, "line 20")
	task := n.task(n.containers(string(p.UID))[0].ID)
	old := n.collectorPID()
	if old == 0 {
		t.Fatal("no log collector runs")
	}
	_, before := numbered(n.readLog(path))
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(waitTimeout)
	var pid int
	for pid = n.collectorPID(); pid == 0 || pid == old; pid = n.collectorPID() {
		if time.Now().After(deadline) {
			t.Fatal("no new log collector after the old one was killed")
		}
		time.Sleep(pollEvery)
	}
	_, back := numbered(n.readLog(path))
	n.waitLogLine(path, fmt.Sprintf("line %d", back+50))
	seen, last := numbered(n.readLog(path))
	var missing []int
	for i := 1; i <= last; i++ {
		if !seen[i] {
			missing = append(missing, i)
		}
	}
	// At most the one line the killed collector had read but not written.
	if len(missing) > 1 || len(missing) == 1 && missing[0] <= before {
		t.Fatalf("lines %v missing; the collector was killed after line %d", missing, before)
	}
	p = n.pod("counter")
	if p.Status.ContainerStatuses[0].RestartCount != 0 || p.Status.Phase != v1.PodRunning {
		t.Fatalf("the container was stopped: %s", statusJSON(p))
	}
	if now := n.task(task.ID); now == nil || now.Pid != task.Pid {
		t.Fatalf("the container's task changed: %v, was PID %d", now, task.Pid)
	}
}

// A full log filesystem drops lines and counts them (GET /logs) without
// blocking the container; once there is space again the log goes on.
func TestLogsDiskFull(t *testing.T) {
	t.Parallel()
	requireE2E(t)
	logs := t.TempDir()
	if err := unix.Mount("tmpfs", logs, "tmpfs", 0, "size=1m,mode=0755"); err != nil {
		t.Fatalf("mount a small tmpfs for the logs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(logs, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", logs, err)
		}
	})
	ballast := filepath.Join(logs, "ballast")
	if err := os.WriteFile(ballast, make([]byte, 1000<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	progress := t.TempDir()
	n := newNode(t, "--pod-log-dir", logs)
	n.writeManifest("filler.yaml", fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: filler}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", "trap 'exit 0' TERM; i=0; while :; do i=$((i+1)); echo line $i xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx; echo $i > /progress/c.tmp; mv /progress/c.tmp /progress/count; sleep 0.005 & wait; done"]
    volumeMounts: [{name: progress, mountPath: /progress}]
  volumes:
  - {name: progress, hostPath: {path: %s, type: Directory}}
`, progress))
	p := n.waitPod("filler", "Running", running)
	path := filepath.Join(logs, fmt.Sprintf("%s_%s_%s", p.Namespace, p.Name, p.UID), "main", "0.log")
	count := func() int {
		b, _ := os.ReadFile(filepath.Join(progress, "count"))
		i, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return i
	}
	var stats crilog.StreamStats
	deadline := time.Now().Add(waitTimeout)
	for {
		s, err := n.logStream(path)
		if err == nil && s.Dropping && s.Dropped > 0 {
			stats = s
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no dropped records reported: %v %+v", err, s)
		}
		time.Sleep(pollEvery)
	}
	// The container goes on while its output is dropped.
	c0 := count()
	time.Sleep(2 * time.Second)
	if c1 := count(); c1 <= c0+10 {
		t.Fatalf("the container made no progress on a full disk: count %d, then %d", c0, c1)
	}
	if s, err := n.logStream(path); err != nil || s.Dropped <= stats.Dropped {
		t.Fatalf("dropped count did not grow: %+v, then %+v (%v)", stats, s, err)
	}
	// The count is exposed to Prometheus too, with the view token.
	metrics := n.kubectlOK(n.kubeconfig(false), "get", "--raw", "/metrics")
	dropped := grepLines(metrics, fmt.Sprintf("noderun_log_dropped_lines_total{log_path=%q} ", path))
	if n, _ := strconv.ParseFloat(strings.TrimSpace(dropped[strings.LastIndex(dropped, " ")+1:]), 64); n < 1 ||
		!strings.Contains(metrics, fmt.Sprintf("noderun_log_dropping{log_path=%q} 1", path)) {
		t.Fatalf("/metrics does not show %s dropping: %s", path, grepLines(metrics, "noderun_log_"))
	}
	// Space again: the log goes on.
	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	_, last := numbered(n.readLog(path))
	c := count()
	deadline = time.Now().Add(waitTimeout)
	for {
		if _, now := numbered(n.readLog(path)); now > c {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the log did not go on after space was freed: last line %d, container at %d", last, c)
		}
		time.Sleep(pollEvery)
	}
	if s, err := n.logStream(path); err != nil || s.Dropping {
		t.Fatalf("still dropping after space was freed: %+v (%v)", s, err)
	}
	if p := n.pod("filler"); p.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Fatalf("the container restarted: %s", statusJSON(p))
	}
}

// As the kubelet, a restarting container keeps the current and the
// previous run's logs; older runs' go, and the collector lets their
// streams go once their containers are removed.
func TestLogRetention(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("crasher.yaml", `apiVersion: v1
kind: Pod
metadata: {name: crasher}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", "echo started; sleep 1; exit 1"]
`)
	p := n.waitPodFor("crasher", "restarted twice", 3*time.Minute, func(p *v1.Pod) bool {
		return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount >= 2
	})
	n.waitLogLine(n.logPath(p, "main", 2), "started")
	dir := filepath.Dir(n.logPath(p, "main", 0))
	deadline := time.Now().Add(waitTimeout)
	for {
		ents, _ := os.ReadDir(dir)
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		restarts := int(n.pod("crasher").Status.ContainerStatuses[0].RestartCount)
		want := []string{fmt.Sprintf("%d.log", restarts-1), fmt.Sprintf("%d.log", restarts)}
		if slices.Equal(names, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("log files %v at restart %d, want %v", names, restarts, want)
		}
		time.Sleep(pollEvery)
	}
	old := n.logPath(p, "main", 0)
	for {
		var all []crilog.StreamStats
		if err := n.get("/logs", &all); err == nil && !slices.ContainsFunc(all, func(s crilog.StreamStats) bool { return s.Path == old }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the collector still has the stream of run 0 (%s)", old)
		}
		time.Sleep(pollEvery)
	}
}

// grepLines keeps the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
