package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd"
	tasksapi "github.com/containerd/containerd/api/services/tasks/v1"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/namespaces"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/noderun/noderun/crilog"
	"github.com/noderun/noderun/internal/testnode"
	"github.com/noderun/noderun/runner"
	ctrddaemon "github.com/noderun/noderun/runner/containerd/daemon"
)

// chaosLong selects the full sizes of the issue (make chaos); by default
// each scenario runs small enough for make test.
var chaosLong = os.Getenv("NODERUN_CHAOS") == "long"

func chaosSize(short, long int) int {
	if chaosLong {
		return long
	}
	return short
}

// chaosTotals adds up what the scenarios saw, for the summary.
var chaosTotals struct {
	sync.Mutex
	completed, pods, restarts, leaks int
	what                             []string // each leak, with its scenario
}

// TestChaos injects faults into noderun, containerd, the network and the
// filesystems under running pods. Every scenario asserts that no healthy pod
// restarted (same task PID), that every desired pod runs at the end and
// that removing them all leaves nothing behind.
func TestChaos(t *testing.T) {
	scenarios := []struct {
		name string
		run  func(*testing.T)
	}{
		{"Kill9DuringChanges", chaosKill9},
		{"Kill9DuringTaskCreate", chaosKill9DuringCreate},
		{"ContainerdDown", chaosContainerdDown},
		{"ShimKilled", chaosShimKilled},
		{"NetnsUnmounted", chaosNetnsUnmounted},
		{"BridgeDeleted", chaosBridgeDeleted},
		{"FilesystemsFull", chaosFilesystemsFull},
		{"StalledURLAndRegistry", chaosStalled},
		{"SecondInstance", chaosSecondInstance},
		{"HostPortChurn", chaosHostPortChurn},
	}
	start := time.Now()
	t.Cleanup(func() {
		c := &chaosTotals
		c.Lock()
		defer c.Unlock()
		mode := "short"
		if chaosLong {
			mode = "long"
		}
		t.Logf("chaos summary (%s): scenarios %d of %d completed, pods %d, healthy pods restarted %d, leaks %d, time %s",
			mode, c.completed, len(scenarios), c.pods, c.restarts, c.leaks, time.Since(start).Round(time.Second))
		if c.restarts > 0 || c.leaks > 0 {
			// Named again here: CI shows the tail of a long log.
			t.Errorf("healthy pods restarted: %d, leaks: %d; want 0 and 0\n  %s", c.restarts, c.leaks, strings.Join(c.what, "\n  "))
		}
	})
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			sc.run(t)
		})
	}
}

// scenario tracks one node through a fault: the pods it should run, the
// healthy ones that must not restart, and the baselines leaks are measured
// against.
type scenario struct {
	t *testing.T
	n *node
	c *containerd.Client // the node's containerd
	w *leakWatch

	baseline  hostState             // before any pod
	desired   map[string]desiredPod // by manifest file
	base      []string              // files running when stats was taken
	healthy   map[string]podRun     // by pod name, before the fault
	restarted map[string]bool
	stats     procStats
	leaks     []string
	completed bool // finish ran to its end
}

type desiredPod struct{ name, gen string }

// podRun is one run of a pod: its UID and each container's task PID.
type podRun struct {
	uid  types.UID
	pids map[string]uint32 // by container ID
}

func newScenario(t *testing.T, n *node, c *containerd.Client) *scenario {
	t.Helper()
	s := &scenario{t: t, n: n, c: c, desired: map[string]desiredPod{}, healthy: map[string]podRun{}, restarted: map[string]bool{}}
	if c != client {
		s.waitImages() // the harness waits only on its shared containerd
	}
	s.w = watchLeaks(n, c)
	s.baseline = s.w.state()
	t.Cleanup(s.report)
	return s
}

func (s *scenario) waitImages() {
	deadline := time.Now().Add(waitTimeout)
	for _, name := range imageNames {
		for {
			img, err := s.c.GetImage(s.n.ctx(), name)
			if err == nil {
				if ok, _ := img.IsUnpacked(s.n.ctx(), snapshotter); ok {
					break
				}
			}
			if time.Now().After(deadline) {
				s.t.Fatalf("image %s not imported after %s: %v", name, waitTimeout, err)
			}
			time.Sleep(pollEvery)
		}
	}
}

const genAnnotation = "e2e.noderun.dev/gen"

// chaosPod is a pod waiting for TERM; gen tells an edit from its original.
func chaosPod(name string, gen int) string {
	return genPod(name, gen, fmt.Sprintf("\n    command: [\"sh\", \"-c\", %q]", fmt.Sprintf("echo gen %d; %s", gen, sleeper)))
}

// genPod is a pod of generation gen (in its annotation) whose container
// main has the further lines body.
func genPod(name string, gen int, body string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  annotations: {%s: "%d"}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: busybox:1.36%s
`, name, genAnnotation, gen, body)
}

// write adds or replaces a manifest the node should run.
func (s *scenario) write(file, name, content string) {
	s.t.Helper()
	s.n.writeManifest(file, content)
	gen := ""
	if i := strings.Index(content, genAnnotation+`: "`); i >= 0 {
		gen, _, _ = strings.Cut(content[i+len(genAnnotation)+3:], `"`)
	}
	s.desired[file] = desiredPod{name, gen}
}

func (s *scenario) remove(file string) {
	s.t.Helper()
	s.n.removeManifest(file)
	delete(s.desired, file)
}

// markHealthy waits for the named pods, remembers their runs as the ones
// that must survive the fault, and takes noderun's fd and goroutine counts.
func (s *scenario) markHealthy(names ...string) {
	s.t.Helper()
	for _, name := range names {
		s.healthy[name] = s.run(s.n.waitPod(name, "Running", running))
	}
	s.base = slices.Collect(maps.Keys(s.desired))
	s.waitDesired(waitTimeout)
	s.stats = s.n.procStats()
}

func (s *scenario) run(p *v1.Pod) podRun {
	s.t.Helper()
	r := podRun{uid: p.UID, pids: map[string]uint32{}}
	for _, cs := range p.Status.ContainerStatuses {
		r.pids[containerID(cs)] = s.task(containerID(cs)).Pid
	}
	return r
}

// task is the container's task, or nil when containerd has none.
func (s *scenario) task(id string) *tasktypes.Process {
	s.t.Helper()
	resp, err := s.c.TaskService().Get(s.n.ctx(), &tasksapi.GetRequest{ContainerID: id})
	if err = errdefs.FromGRPC(err); errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		s.t.Fatalf("task %s: %v", id, err)
	}
	return resp.Process
}

// checkHealthy reports every healthy pod that is not running its first
// run: another task PID (asked of containerd, so a noderun that does not
// answer cannot hide it) or another UID. Each counts once.
func (s *scenario) checkHealthy() {
	s.t.Helper()
	var list v1.PodList
	apiErr := s.n.get("/pods", &list)
	if apiErr != nil {
		s.t.Errorf("status API: %v; checking healthy pods in containerd only", apiErr)
	}
	for _, name := range slices.Sorted(maps.Keys(s.healthy)) {
		if s.restarted[name] {
			continue
		}
		want := s.healthy[name]
		var why string
		for id, pid := range want.pids {
			if tk := s.task(id); tk == nil || tk.Status != tasktypes.Status_RUNNING || tk.Pid != pid {
				why += fmt.Sprintf("task %s is %v, was RUNNING pid %d; ", id, tk, pid)
			}
		}
		i := slices.IndexFunc(list.Items, func(p v1.Pod) bool { return p.Name == name+"-"+nodeName })
		switch {
		case apiErr != nil:
		case i < 0:
			why += "not listed"
		case list.Items[i].UID != want.uid:
			why += fmt.Sprintf("UID %s, was %s", list.Items[i].UID, want.uid)
		}
		if why != "" {
			s.restarted[name] = true
			s.t.Errorf("healthy pod %s restarted or lost: %s", name, why)
		}
	}
}

// checkOneRunEach asserts containerd holds one container per container of
// each listed pod, the current run: a crash in the wrong moment must not
// leave an older run or a second one beside it.
func (s *scenario) checkOneRunEach() {
	s.t.Helper()
	for _, p := range s.n.pods() {
		var want []string
		for _, cs := range p.Status.ContainerStatuses {
			want = append(want, containerID(cs))
		}
		cs, err := s.c.ContainerService().List(s.n.ctx(), fmt.Sprintf(podUIDFilter, p.UID))
		if err != nil {
			s.t.Fatal(err)
		}
		var got []string
		for _, c := range cs {
			got = append(got, c.ID)
		}
		slices.Sort(want)
		slices.Sort(got)
		if !slices.Equal(got, want) {
			s.t.Errorf("pod %s: containerd holds %q, want its current runs %q", p.Name, got, want)
		}
	}
}

// waitDesired waits until every desired pod runs, at its latest edit.
func (s *scenario) waitDesired(timeout time.Duration) {
	s.t.Helper()
	for _, file := range slices.Sorted(maps.Keys(s.desired)) {
		d := s.desired[file]
		s.n.waitPodFor(d.name, "Running at gen "+d.gen, timeout, func(p *v1.Pod) bool {
			return running(p) && p.Annotations[genAnnotation] == d.gen
		})
	}
}

// finish asserts the end state: every desired pod runs, no healthy pod
// restarted, noderun holds no more fds and goroutines than before with the
// same pods, and removing every pod leaves nothing behind.
func (s *scenario) finish() {
	t, n := s.t, s.n
	t.Helper()
	s.waitDesired(60 * time.Second)
	s.checkHealthy()
	s.checkOneRunEach()
	var leaks []string // noderun's own; those on the host are added below
	for file := range s.desired {
		if !slices.Contains(s.base, file) {
			s.remove(file)
		}
	}
	for _, d := range s.desired {
		n.waitPod(d.name, "Running", running)
	}
	for _, p := range n.pods() {
		if !slices.ContainsFunc(slices.Collect(maps.Values(s.desired)), func(d desiredPod) bool { return d.name+"-"+nodeName == p.Name }) {
			n.waitGone(strings.TrimSuffix(p.Name, "-"+nodeName), 60*time.Second)
		}
	}
	if n.running() {
		st, ok := n.waitProcSettled(s.stats, 20*time.Second)
		if !ok {
			l := fmt.Sprintf("noderun holds %d fds and %d goroutines, its log collector %d fds; %d, %d and %d before the fault with the same pods",
				st.fds, st.goroutines, st.collectorFDs, s.stats.fds, s.stats.goroutines, s.stats.collectorFDs)
			t.Error(l)
			leaks = append(leaks, l)
		}
		t.Logf("noderun's fds %d -> %d, goroutines %d -> %d, log collector's fds %d -> %d",
			s.stats.fds, st.fds, s.stats.goroutines, st.goroutines, s.stats.collectorFDs, st.collectorFDs)
	}
	for file := range s.desired {
		s.remove(file)
	}
	for _, p := range n.pods() {
		n.waitGone(strings.TrimSuffix(p.Name, "-"+nodeName), 60*time.Second)
	}
	l := s.w.waitNoLeaks(s.baseline, 30*time.Second)
	if len(l) > 0 {
		t.Errorf("left behind after removing every pod:\n  %s", strings.Join(l, "\n  "))
	}
	s.leaks = append(leaks, l...)
	s.completed = true
}

// report adds the scenario to the totals, also when it stopped early.
func (s *scenario) report() {
	c := &chaosTotals
	c.Lock()
	defer c.Unlock()
	if s.completed {
		c.completed++
	}
	c.pods += s.w.podCount()
	c.restarts += len(s.restarted)
	c.leaks += len(s.leaks)
	for _, l := range s.leaks {
		c.what = append(c.what, s.t.Name()+": "+l)
	}
	for name := range s.restarted {
		c.what = append(c.what, s.t.Name()+": restarted "+name)
	}
}

func steadyPods(s *scenario, n int) []string {
	var names []string
	for i := range n {
		name := fmt.Sprintf("steady%d", i)
		s.write(name+".yaml", name, chaosPod(name, 0))
		names = append(names, name)
	}
	return names
}

// Kill -9 of noderun at random moments while pods are started, edited and
// removed: the healthy pods keep their tasks and the last state of every
// manifest is what runs.
func chaosKill9(t *testing.T) {
	n := newNode(t)
	s := newScenario(t, n, client)
	s.markHealthy(steadyPods(s, 2)...)
	rng := newRand(t)
	gens := map[string]int{}
	ops := chaosSize(5, 50)
	for range ops {
		name := fmt.Sprintf("churn%d", rng.IntN(4))
		file := name + ".yaml"
		// A start, or an edit or a removal in equal parts.
		if _, present := s.desired[file]; !present || rng.IntN(2) == 0 {
			gens[name]++
			s.write(file, name, chaosPod(name, gens[name]))
		} else {
			s.remove(file)
		}
		// Up to 1.5 s lands in the notice, the start or the teardown.
		time.Sleep(time.Duration(rng.IntN(1500)) * time.Millisecond)
		n.kill9()
		n.start()
	}
	t.Logf("%d changes, each followed by a kill -9 and a restart", ops)
	s.finish()
}

// Kill -9 of noderun while a task create waits in the node's one shared
// shim, stopped (SIGSTOP) until containerd has connected to it for the
// create (the shim binary's start first connects to see the shim is
// there, then containerd connects to send the create): the shim then takes the create and containerd's cleanup of it
// together, in either order, and may keep a task containerd dropped. The
// shim's other pods keep their tasks, each new pod runs, and nothing is
// left once the pods are removed. Once, or 5 times at the full size.
func chaosKill9DuringCreate(t *testing.T) {
	n := newNode(t, "--shim-groups", "1")
	s := newScenario(t, n, client)
	healthy := steadyPods(s, 2)
	s.markHealthy(healthy...)
	var pid uint32
	for _, p := range s.healthy[healthy[0]].pids {
		pid = p
	}
	shim := shimOf(t, pid)
	reps := chaosSize(1, 5)
	for i := range reps {
		name := fmt.Sprintf("late%d", i)
		createKilled(t, s, shim, name)
		n.waitPodFor(name, "Running after noderun's restart", 60*time.Second, running)
	}
	b, _ := os.ReadFile(n.out)
	t.Logf("%d kills during a create; noderun deleted %d tasks containerd had lost in the shim", reps,
		strings.Count(string(b), "deleted a task containerd lost in"))
	s.finish()
}

// createKilled writes pod name with the shim stopped, kills noderun once
// containerd has connected to the shim for the pod's task, resumes the
// shim and starts noderun again.
func createKilled(t *testing.T, s *scenario, shim int, name string) {
	t.Helper()
	if err := syscall.Kill(shim, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = syscall.Kill(shim, syscall.SIGCONT) }()
	s.write(name+".yaml", name, chaosPod(name, 0))
	for deadline := time.Now().Add(waitTimeout); pendingConnections(t, shim) < 2; time.Sleep(pollEvery / 10) {
		if time.Now().After(deadline) {
			t.Fatalf("containerd did not connect to the stopped shim %d for %s's task within %s", shim, name, waitTimeout)
		}
	}
	s.n.kill9()
	if err := syscall.Kill(shim, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	s.n.start()
}

// pendingConnections is how many connections wait for the listening
// sockets of process pid to accept them (ss's Recv-Q of a listener).
func pendingConnections(t *testing.T, pid int) int {
	t.Helper()
	out, err := exec.Command("ss", "-xlpn").Output()
	if err != nil {
		t.Fatalf("ss: %v", err)
	}
	n := 0
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) > 2 && strings.Contains(line, fmt.Sprintf("pid=%d,", pid)) {
			q, _ := strconv.Atoi(f[2])
			n += q
		}
	}
	return n
}

// The node's own containerd is stopped for 10 s and started again while
// pods start and one crashes: healthy pods keep their tasks, the pods
// written meanwhile start, and the exit missed while containerd was down is
// a restart of the crashed container.
func chaosContainerdDown(t *testing.T) {
	requireE2E(t)
	cd := startOwnContainerd(t)
	n := newNode(t, "--containerd-address", cd.socket)
	cd.ns = n.ns
	s := newScenario(t, n, cd.c)
	s.markHealthy(steadyPods(s, 2)...)

	// The first run exits 4 s after it starts, while containerd is down;
	// the emptyDir remembers it ran, so the next run stays up.
	s.write("crash.yaml", "crash", `apiVersion: v1
kind: Pod
metadata: {name: crash}
spec:
  terminationGracePeriodSeconds: 2
  volumes: [{name: d, emptyDir: {}}]
  containers:
  - name: main
    image: busybox:1.36
    volumeMounts: [{name: d, mountPath: /d}]
    command: ["sh", "-c", "if [ -e /d/ran ]; then `+sleeper+`; fi; touch /d/ran; sleep 4; exit 1"]
`)
	n.waitPod("crash", "Running", running)
	s.write("new0.yaml", "new0", chaosPod("new0", 1))
	s.write("new1.yaml", "new1", chaosPod("new1", 1))
	cd.stop()
	s.write("new2.yaml", "new2", chaosPod("new2", 1))
	time.Sleep(10 * time.Second)
	cd.start()

	n.waitHealthy()
	p := n.waitPodFor("crash", "restarted once after the exit missed while containerd was down", 60*time.Second, func(p *v1.Pod) bool {
		return running(p) && p.Status.ContainerStatuses[0].RestartCount == 1
	})
	if lt := p.Status.ContainerStatuses[0].LastTerminationState.Terminated; lt == nil || lt.ExitCode != 1 {
		t.Errorf("crash: lastState.terminated = %+v, want exit code 1", lt)
	}
	s.finish()
}

// ownContainerd is a containerd of one test's own, which it may stop.
type ownContainerd struct {
	t                        *testing.T
	root, state, socket, log string
	d                        *ctrddaemon.Process // nil while stopped
	c                        *containerd.Client
	ns                       string // the node's namespace, emptied at the end
}

func startOwnContainerd(t *testing.T) *ownContainerd {
	t.Helper()
	// A short path: the socket must fit sun_path.
	dir, err := os.MkdirTemp("/tmp", "nrc")
	if err != nil {
		t.Fatal(err)
	}
	cd := &ownContainerd{t: t, root: filepath.Join(dir, "root"), state: filepath.Join(dir, "state"),
		socket: filepath.Join(dir, "c.sock"), log: filepath.Join(dir, "containerd.log")}
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(cd.log)
			t.Logf("containerd log (%s), last part:\n%s", cd.log, tail(b))
		}
		_ = os.RemoveAll(dir)
	})
	t.Cleanup(func() {
		if cd.c != nil {
			defer cd.c.Close()
		}
		if cd.d == nil { // stopped by a test that failed before restarting it
			cd.start()
		}
		cd.clear()
		cd.stop()
	})
	cd.start()
	if cd.c, err = containerd.New(cd.socket, containerd.WithTimeout(10*time.Second)); err != nil {
		t.Fatal(err)
	}
	return cd
}

func (cd *ownContainerd) start() {
	cd.t.Helper()
	d, err := ctrddaemon.Start(context.Background(), cd.root, cd.state, cd.socket, cd.log)
	if err != nil {
		cd.t.Fatal(err)
	}
	cd.d = d
}

// stop ends containerd; its shims, and so the containers, keep running.
func (cd *ownContainerd) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := cd.d.Stop(ctx); err != nil {
		cd.t.Errorf("stop containerd: %v", err)
	}
	cd.d = nil
}

// clear kills and deletes what the node left in the namespace, which the
// harness's cleanup (on the shared containerd) cannot see.
func (cd *ownContainerd) clear() {
	if cd.ns == "" || cd.c == nil {
		return
	}
	ctx, cancel := context.WithTimeout(namespaces.WithNamespace(context.Background(), cd.ns), time.Minute)
	defer cancel()
	_ = testnode.RemoveContainers(ctx, cd.c)
}

// A shim killed under a pod: that pod's container runs again (and its old
// process is gone), and so do those of the pods its shim served too (the
// node's pods share --shim-groups shims); the others are untouched.
func chaosShimKilled(t *testing.T) {
	n := newNode(t)
	s := newScenario(t, n, client)
	s.write("victim.yaml", "victim", chaosPod("victim", 0))
	s.markHealthy(steadyPods(s, 4)...)
	v := n.waitPod("victim", "Running", running)
	pid := s.task(containerID(v.Status.ContainerStatuses[0])).Pid
	shim := shimOf(t, pid)
	victims := map[string]uint32{"victim": pid}
	for name, r := range s.healthy {
		for _, p := range r.pids {
			if shimOf(t, p) == shim {
				victims[name] = p
				delete(s.healthy, name)
			}
		}
	}
	// All five in one of 4 groups (1 in 256): only the restarts are seen.
	t.Logf("the shim serves %d of %d pods", len(victims), len(victims)+len(s.healthy))
	if err := killPID(shim); err != nil {
		t.Fatal(err)
	}
	for name, pid := range victims {
		n.waitPodFor(name, "running again after its shim was killed", 60*time.Second, func(p *v1.Pod) bool {
			return running(p) && p.Status.ContainerStatuses[0].RestartCount >= 1
		})
		waitDead(t, int(pid), name+"'s container process, after its shim was killed")
	}
	s.finish()
}

// A pod's pinned netns unmounted under it: the pod ends up serving on its
// pod IP (in place or in a new sandbox) and nothing of the old one leaks.
func chaosNetnsUnmounted(t *testing.T) {
	n := newNode(t)
	s := newScenario(t, n, client)
	s.write("victim.yaml", "victim", webPod("victim", "victim-page", 0))
	s.markHealthy(steadyPods(s, 2)...)
	v := n.waitPod("victim", "Running", running)
	// Something else holding the netns (a copy of the pin in a mount
	// namespace unshared meanwhile, as on a busy host; seen in the parallel
	// suite) keeps its veth alive after the pod's processes are gone, so
	// only noderun deleting it by name leaves no veth behind.
	pid := s.task(containerID(v.Status.ContainerStatuses[0])).Pid
	held, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { held.Close() })
	netns := filepath.Join(n.run, "pods", sandboxOf(v), "net")
	if err := unmount(netns); err != nil {
		t.Fatalf("unmount %s: %v", netns, err)
	}
	// Give noderun a sync or two to notice, then a restart, which checks
	// every adopted sandbox.
	time.Sleep(5 * time.Second)
	n.kill9()
	n.start()
	s.waitServes("victim", "victim-page\n", 0, 60*time.Second)
	s.finish()
}

// The CNI bridge deleted: the pods on it serve again on their pod IPs and
// hostPorts, new pods start, and a hostNetwork pod is untouched.
func chaosBridgeDeleted(t *testing.T) {
	n := newNode(t)
	s := newScenario(t, n, client)
	port := freePort(t)
	s.write("web0.yaml", "web0", webPod("web0", "page0", port))
	s.write("web1.yaml", "web1", webPod("web1", "page1", 0))
	s.write("hostnet.yaml", "hostnet", strings.Replace(chaosPod("hostnet", 0), "spec:\n", "spec:\n  hostNetwork: true\n", 1))
	s.markHealthy("hostnet")
	s.waitServes("web0", "page0\n", port, waitTimeout)
	if out, err := exec.Command("ip", "link", "del", n.bridge).CombinedOutput(); err != nil {
		t.Fatalf("ip link del %s: %v: %s", n.bridge, err, out)
	}
	time.Sleep(2 * time.Second)
	s.waitServes("web0", "page0\n", port, 60*time.Second)
	s.waitServes("web1", "page1\n", 0, 60*time.Second)
	s.write("web2.yaml", "web2", webPod("web2", "page2", 0))
	s.waitServes("web2", "page2\n", 0, 60*time.Second)
	s.finish()
}

// waitServes waits until the pod runs and answers page on its pod IP and,
// if hostPort is set, on the bridge gateway's hostPort.
func (s *scenario) waitServes(name, page string, hostPort int, timeout time.Duration) {
	s.t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		p := s.n.pod(name)
		if p == nil || !running(p) {
			last = "not running: " + statusJSON(p)
			time.Sleep(pollEvery)
			continue
		}
		urls := []string{"http://" + p.Status.PodIP + ":8080/"}
		if hostPort > 0 {
			urls = append(urls, fmt.Sprintf("http://%s:%d/", s.n.gateway(), hostPort))
		}
		last = ""
		for _, u := range urls {
			if got, err := getOnce(u); err != nil || got != page {
				last += fmt.Sprintf("GET %s: %q %v; ", u, got, err)
			}
		}
		if last == "" {
			return
		}
		time.Sleep(pollEvery)
	}
	s.t.Fatalf("pod %s does not serve %q after %s: %s", name, page, timeout, last)
}

// The state dir's and the log dir's filesystems full (size-limited tmpfs),
// then freed: running pods keep running, noderun keeps answering, and once
// there is room the pod written meanwhile and new ones start and logs flow.
func chaosFilesystemsFull(t *testing.T) {
	requireE2E(t)
	dir := t.TempDir()
	state, logs := filepath.Join(dir, "s"), filepath.Join(dir, "l")
	for _, d := range []string{state, logs} {
		mountTmpfs(t, d, "16m")
	}
	n := newNode(t)
	n.stop()
	n.state, n.logs = state, logs
	n.resetCNIConfig()
	n.start()
	s := newScenario(t, n, client)
	s.write("talker.yaml", "talker", `apiVersion: v1
kind: Pod
metadata: {name: talker}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", "trap 'exit 0' TERM; i=0; while :; do i=$((i+1)); echo line $i; sleep 0.1 & wait; done"]
`)
	s.markHealthy(append(steadyPods(s, 2), "talker")...)
	talker := n.pod("talker")
	logPath := n.logPath(talker, "main", 0)

	fills := []string{fillUp(t, state), fillUp(t, logs)}
	s.write("new0.yaml", "new0", chaosPod("new0", 1))
	time.Sleep(10 * time.Second)
	if !n.running() {
		t.Fatalf("noderun exited with the filesystems full: %v", n.proc.ProcessState)
	}
	if got := len(n.pods()); got != len(s.desired) {
		t.Errorf("status API lists %d pods with the filesystems full, want %d (new0 too, pending)", got, len(s.desired))
	}
	s.checkHealthy()

	for _, f := range fills {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
	freed, _ := logLines(t, logPath)
	deadline := time.Now().Add(waitTimeout)
	got, bad := logLines(t, logPath)
	for got < freed+10 && time.Now().Before(deadline) {
		time.Sleep(pollEvery)
		got, bad = logLines(t, logPath)
	}
	if got < freed+10 {
		t.Errorf("talker's log grew from %d to %d lines in %s after the log dir was freed", freed, got, waitTimeout)
	}
	// A reader (kubectl logs, a log shipper) must be able to parse the file.
	if len(bad) > 0 {
		t.Errorf("talker's log has %d lines that are not CRI log lines after the log dir was full, e.g. %q", len(bad), bad[0])
	}
	s.write("new1.yaml", "new1", chaosPod("new1", 1))
	s.finish()
}

// logLines counts a CRI log's lines and returns those that do not parse.
func logLines(t *testing.T, path string) (int, []string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n, bad := 0, []string(nil)
	for _, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		if _, _, _, _, err := crilog.ParseLine(line); err != nil {
			bad = append(bad, line)
			continue
		}
		n++
	}
	return n, bad
}

// fillUp writes a file into dir until its filesystem is full.
func fillUp(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "fill")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("fill %s: %v", dir, err)
			}
			return path
		}
	}
}

// A manifest URL and an image registry that accept connections and never
// answer: noderun stays healthy, file pods start, the pull is given up on,
// the stuck pod can be removed, connections are not piled up, and SIGTERM
// still ends noderun promptly.
func chaosStalled(t *testing.T) {
	requireE2E(t)
	l := stallListener(t)
	n := newNode(t, "--manifest-url", "http://"+l.addr()+"/pods.yaml", "--url-check-interval", "1s",
		"--image-pull-progress-timeout", "5s")
	s := newScenario(t, n, client)
	s.markHealthy(steadyPods(s, 2)...)
	stalled := time.Now()

	n.writeManifest("stuck.yaml", imagePod("stuck", l.addr()+"/stuck:1", "IfNotPresent"))
	n.waitPodFor("stuck", "given up on", 30*time.Second, func(p *v1.Pod) bool {
		r, msg := waitingReason(p, "main")
		return (r == "ErrImagePull" || r == "ImagePullBackOff") && msg != ""
	})
	s.write("new0.yaml", "new0", chaosPod("new0", 1))
	n.waitPodFor("new0", "Running while the URL and registry stall", 20*time.Second, running)

	time.Sleep(time.Until(stalled.Add(time.Duration(chaosSize(15, 120)) * time.Second)))
	// One manifest fetch and a pull or two may be waiting at any moment;
	// more means given-up requests keep their connections.
	if open := l.open(); open > 4 {
		t.Errorf("%d connections to the stalled server are open after %s, want at most 4",
			open, time.Since(stalled).Round(time.Second))
	}
	n.removeManifest("stuck.yaml")
	n.waitGone("stuck", 15*time.Second)
	s.finish()

	began := time.Now()
	n.stop()
	if took := time.Since(began); took > 10*time.Second {
		t.Errorf("SIGTERM took %s to end noderun with a stalled URL", took.Round(time.Millisecond))
	}
}

// A second noderun on the same directories exits non-zero naming the
// holder's PID, and the first keeps serving with nothing restarted.
func chaosSecondInstance(t *testing.T) {
	n := newNode(t)
	s := newScenario(t, n, client)
	s.markHealthy(steadyPods(s, 2)...)
	holder := n.proc.Process.Pid
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", holder))
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Split(strings.TrimSuffix(string(cmdline), "\x00"), "\x00")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	second := exec.CommandContext(ctx, args[0], args[1:]...)
	second.Env = n.proc.Env
	second.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := second.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Errorf("the second noderun was still running after 30s (killed); output:\n%s", tail(out))
	case err == nil:
		t.Errorf("the second noderun exited 0; output:\n%s", tail(out))
	case !errors.As(err, &exit):
		t.Fatal(err)
	case !strings.Contains(string(out), fmt.Sprint(holder)):
		t.Errorf("the second noderun failed (%v) without naming the holder's PID %d:\n%s", err, holder, tail(out))
	}
	s.checkHealthy()
	if !n.running() {
		t.Fatalf("the first noderun exited: %v", n.proc.ProcessState)
	}
	n.waitHealthy()
	s.write("new0.yaml", "new0", chaosPod("new0", 1))
	s.finish()
}

// tail is the end of a process's output, enough to see why it stopped.
func tail(b []byte) string {
	const keep = 3000
	if len(b) > keep {
		b = b[len(b)-keep:]
	}
	return string(b)
}

// Create/delete cycles in 4 parallel streams, each pod with a hostPort,
// beside a pod whose hostPort must keep working throughout.
func chaosHostPortChurn(t *testing.T) {
	n := newNode(t)
	s := newScenario(t, n, client)
	const streams = 4
	ports := freePorts(t, streams+1)
	port := ports[streams]
	s.write("keep.yaml", "keep", webPod("keep", "kept", port))
	s.markHealthy("keep")
	s.waitServes("keep", "kept\n", port, waitTimeout)

	cycles := chaosSize(13, 250) // 52 or 1,000 in all
	if err := n.churnStreams(ports[:streams], cycles); err != nil {
		t.Error(err)
	}
	t.Logf("%d create/delete cycles with hostPorts %v beside the kept pod's %d", streams*cycles, ports[:streams], port)
	s.waitServes("keep", "kept\n", port, waitTimeout)
	// A rule left by the churn would send the port to a pod long gone.
	s.write("reuse.yaml", "reuse", webPod("reuse", "reused", ports[0]))
	s.waitServes("reuse", "reused\n", ports[0], waitTimeout)
	s.finish()
}

func newRand(t *testing.T) *rand.Rand {
	seed := uint64(time.Now().UnixNano())
	t.Logf("random seed %d", seed)
	return rand.New(rand.NewPCG(seed, seed))
}

func sandboxOf(p *v1.Pod) string { return runner.SandboxID(string(p.UID)) }

func unmount(path string) error { return unix.Unmount(path, unix.MNT_DETACH) }

func killPID(pid int) error { return syscall.Kill(pid, syscall.SIGKILL) }

// mountTmpfs mounts a tmpfs of the given size at dir until the test ends.
func mountTmpfs(t *testing.T, dir, size string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		t.Fatalf("tmpfs at %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := unmount(dir); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
}

// waitDead fails the test if pid is still a live process after a while.
func waitDead(t *testing.T, pid int, what string) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Errorf("%s (pid %d) still runs after %s", what, pid, waitTimeout)
			return
		}
		time.Sleep(pollEvery)
	}
}

// getOnce fetches url once, without a proxy.
func getOnce(url string) (string, error) {
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := hc.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = errors.New(resp.Status)
	}
	return string(b), err
}

// stall accepts connections and never answers; it counts those still open.
type stall struct {
	l     net.Listener
	mu    sync.Mutex
	conns map[net.Conn]bool
}

func stallListener(t *testing.T) *stall {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &stall{l: l, conns: map[net.Conn]bool{}}
	t.Cleanup(func() {
		l.Close()
		s.mu.Lock()
		defer s.mu.Unlock()
		for c := range s.conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns[c] = true
			s.mu.Unlock()
			go func() {
				// Read until the client gives up; never write.
				_, _ = io.Copy(io.Discard, c)
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
				c.Close()
			}()
		}
	}()
	return s
}

func (s *stall) addr() string { return s.l.Addr().String() }

func (s *stall) open() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// freePorts returns k distinct free ports: each listener stays open until
// all are chosen, as one closed at once may be handed out again.
func freePorts(t *testing.T, k int) []int {
	t.Helper()
	var ports []int
	for range k {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}
