package e2e

import (
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd"
	eventstypes "github.com/containerd/containerd/api/events"
	tasksapi "github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/events"
	"github.com/containerd/containerd/leases"
	"github.com/containerd/containerd/snapshots"
	"github.com/containerd/typeurl/v2"

	"github.com/noderun/noderun/crilog"
	"github.com/noderun/noderun/internal/testnode"
	ctrdrt "github.com/noderun/noderun/runner/containerd"
)

// hostState is everything a node's pods can leave on the host, by kind, as
// sorted names, so that a difference names what leaked.
type hostState map[string][]string

// leakWatch remembers every pod that got a container on a node, through
// containerd's events, so that cgroups (under the /noderun root all nodes
// share) can be told apart and the pods counted.
type leakWatch struct {
	n *node
	c *containerd.Client // the node's containerd

	mu   sync.Mutex
	pods map[string]bool // the 12-hex prefix shared by SandboxID and ContainerID
}

// watchLeaks subscribes to the node's container creations until the test
// ends; a containerd restart is ridden out by subscribing again.
func watchLeaks(n *node, c *containerd.Client) *leakWatch {
	w := &leakWatch{n: n, c: c, pods: map[string]bool{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	n.t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			evs, errs := c.Subscribe(ctx, fmt.Sprintf(`namespace==%q,topic=="/containers/create"`, n.ns))
			w.receive(ctx, evs, errs)
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return w
}

func (w *leakWatch) receive(ctx context.Context, evs <-chan *events.Envelope, errs <-chan error) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-errs:
			return
		case env := <-evs:
			v, err := typeurl.UnmarshalAny(env.Event)
			if cc, ok := v.(*eventstypes.ContainerCreate); err == nil && ok && len(cc.ID) >= 12 {
				w.mu.Lock()
				w.pods[cc.ID[:12]] = true
				w.mu.Unlock()
			}
		}
	}
}

// podCount is how many pods got a container on the node so far.
func (w *leakWatch) podCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.pods)
}

// state takes stock of the node's containerd namespace, its directories,
// network and cgroups.
func (w *leakWatch) state() hostState {
	n, t := w.n, w.n.t
	t.Helper()
	ctx, cancel := context.WithTimeout(n.ctx(), 20*time.Second)
	defer cancel()
	s := hostState{}
	add := func(kind string, names ...string) { s[kind] = append(s[kind], names...) }
	must := func(what string, err error) {
		if err != nil {
			t.Fatalf("leak check: %s: %v", what, err)
		}
	}

	cs, err := w.c.ContainerService().List(ctx)
	must("containers", err)
	for _, c := range cs {
		add("containers", c.ID)
	}
	tasks, err := w.c.TaskService().List(ctx, &tasksapi.ListTasksRequest{})
	must("tasks", err)
	for _, tk := range tasks.Tasks {
		add("tasks", tk.ID)
	}
	must("snapshots", w.c.SnapshotService(snapshotter).Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		add("snapshots", info.Name)
		return nil
	}))
	leases, err := w.c.LeasesService().List(ctx)
	must("leases", err)
	stock := 0
	for _, l := range leases {
		if w.stocked(ctx, l) {
			stock++
			continue
		}
		// The expiry says whether containerd would collect it, and when.
		add("leases", fmt.Sprintf("%s (created %s, expires %q)", l.ID, l.CreatedAt.Format(time.TimeOnly), l.Labels["containerd.io/gc.expire"]))
	}
	// The stock is filled in the background after start, so a baseline
	// may be taken before or after it is: only a stock beyond its size
	// (runner/containerd's leaseStockSize) is a leak.
	if stock > maxLeaseStock {
		add("leases", fmt.Sprintf("the running noderun's stock of %d create leases, more than %d", stock, maxLeaseStock))
	}

	// Each sandbox dir holds the pod's pinned namespaces.
	sbs, _ := os.ReadDir(filepath.Join(n.run, "pods"))
	for _, sb := range sbs {
		add("sandboxes", sb.Name())
	}
	// The node's namespaces are pinned in its sandbox dirs (above), never
	// named in /var/run/netns: the names there belong to other software
	// on the host (a CRI containerd's cni-*), which made this check fail
	// whenever such software ran beside the tests.
	add("mounts", mountsUnder(t, n.root)...)
	if _, err := net.InterfaceByName(n.bridge); err == nil {
		add("veths", n.hostVeths()...)
	}
	add("ip leases", n.leases()...)
	add("cni cache", n.cniCache()...)
	add("iptables", w.iptablesRules()...)
	add("cgroups", w.cgroups()...)
	add("processes", n.processes()...)
	if n.running() {
		add("log collectors", fmt.Sprintf("%d running", n.collectors()))
	}
	for k := range s {
		slices.Sort(s[k])
	}
	return s
}

// processes are the node's shims (started with its containerd namespace)
// and log drivers (writing under its log dir): each should end with the
// task it served, even when containerd no longer lists the task.
func (n *node) processes() []string {
	var out []string
	procs, _ := testnode.Processes()
	for _, p := range procs {
		args := p.Args
		if len(args) == 0 {
			continue
		}
		shim := strings.HasSuffix(args[0], "containerd-shim-runc-v2") && slices.Contains(args, n.ns)
		// A driver that found no collector writes the log itself until its
		// container ends.
		driver := false
		if len(args) > 2 && args[1] == "log-driver" {
			t, err := crilog.ParseArg(args[2])
			driver = err == nil && strings.HasPrefix(t.Path, n.logs+"/")
		}
		if shim || driver {
			out = append(out, strings.Join(args, " "))
		}
	}
	return out
}

// iptablesRules are the rules and chains naming the node's network or
// subnet, in the tables CNI's bridge and portmap plugins write.
func (w *leakWatch) iptablesRules() []string {
	n := w.n
	prefix := strings.TrimSuffix(n.subnet, "0/24") // "10.211.N."
	var out []string
	for _, table := range []string{"nat", "filter"} {
		b, err := exec.Command("iptables-save", "-t", table).Output()
		if err != nil {
			n.t.Fatalf("leak check: iptables-save -t %s: %v", table, err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, "noderun masquerade, network ") {
				continue // the node's, made at its first pod, kept until reset (TestResetRestoresTheHost)
			}
			if strings.Contains(line, fmt.Sprintf(`name: \"%s\"`, n.netName)) || strings.Contains(line, " "+prefix) {
				out = append(out, table+": "+line)
			}
		}
	}
	return out
}

// cgroups lists the pod cgroups of the node's pods, in every hierarchy.
func (w *leakWatch) cgroups() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, root := range cgroupRoots(w.n.t) {
		var dirs []string
		for _, tier := range []string{"", "burstable", "besteffort"} { // the QoS parents
			ds, _ := filepath.Glob(filepath.Join(root, "noderun", tier, "pod*"))
			dirs = append(dirs, ds...)
		}
		for _, d := range dirs {
			if id := strings.TrimPrefix(filepath.Base(d), "pod"); len(id) >= 12 && w.pods[id[:12]] {
				out = append(out, d)
			}
		}
	}
	return out
}

// maxLeaseStock is runner/containerd's leaseStockSize.
const maxLeaseStock = 4

// stocked reports whether l is one of the create leases the running
// noderun takes ahead of need: it holds nothing, and its owner lives.
// Its ID changes with each creation; one that holds a snapshot, or whose
// noderun is gone, is a leak.
func (w *leakWatch) stocked(ctx context.Context, l leases.Lease) bool {
	if l.Labels[ctrdrt.LabelLease] != "create" || !w.n.running() {
		return false
	}
	if f := strings.Fields(l.Labels[ctrdrt.LabelLeaseOwner]); len(f) != 3 || f[1] != strconv.Itoa(w.n.proc.Process.Pid) {
		return false
	}
	rs, err := w.c.LeasesService().ListResources(ctx, l)
	return err == nil && len(rs) == 0
}

// leaked lists what after holds that before did not.
func leaked(before, after hostState) []string {
	var out []string
	for _, kind := range slices.Sorted(maps.Keys(after)) {
		for _, name := range after[kind] {
			if !slices.Contains(before[kind], name) {
				out = append(out, kind+": "+name)
			}
		}
	}
	return out
}

// waitNoLeaks waits for the host to return to baseline (teardown is
// asynchronous) and returns what is still left over.
func (w *leakWatch) waitNoLeaks(baseline hostState, timeout time.Duration) []string {
	w.n.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		l := leaked(baseline, w.state())
		if len(l) == 0 || time.Now().After(deadline) {
			return l
		}
		time.Sleep(5 * pollEvery)
	}
}

// procStats is what a noderun process holds, open fds and goroutines,
// and the fds its log collector holds (3 a container: two pipes, the log).
type procStats struct{ fds, goroutines, collectorFDs int }

var goroutineTotal = regexp.MustCompile(`goroutine profile: total (\d+)`)

func (n *node) procStats() procStats {
	n.t.Helper()
	fds, _, err := testnode.FDs(n.proc.Process.Pid)
	if err != nil {
		n.t.Fatalf("noderun's fds: %v", err)
	}
	var body string
	if err := n.get("/debug/pprof/goroutine?debug=1", &body); err != nil {
		n.t.Fatalf("noderun's goroutines: %v", err)
	}
	m := goroutineTotal.FindStringSubmatch(body)
	if m == nil {
		n.t.Fatalf("no goroutine total in the profile:\n%.300s", body)
	}
	g, _ := strconv.Atoi(m[1])
	var cfds int
	if pid := n.collectorPID(); pid != 0 {
		cfds, _, _ = testnode.FDs(pid)
	}
	return procStats{fds: fds, goroutines: g, collectorFDs: cfds}
}

// Growth allowed between two quiet moments with the same pods: connections
// and timers come and go.
const fdSlack, goroutineSlack = 4, 8

// waitProcSettled waits until noderun holds no more than base plus the
// slack, and returns the last reading if it never does.
func (n *node) waitProcSettled(base procStats, timeout time.Duration) (procStats, bool) {
	n.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		s := n.procStats()
		if s.fds <= base.fds+fdSlack && s.goroutines <= base.goroutines+goroutineSlack && s.collectorFDs <= base.collectorFDs+fdSlack {
			return s, true
		}
		if time.Now().After(deadline) {
			return s, false
		}
		time.Sleep(5 * pollEvery)
	}
}

// shimOf is the containerd shim that is the parent of a task's process.
func shimOf(t *testing.T, pid uint32) int {
	t.Helper()
	v, err := testnode.StatusValues(int(pid), "PPid")
	if err != nil {
		t.Fatal(err)
	}
	ppid := int(v["PPid"])
	cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", ppid))
	if !strings.Contains(string(cmd), "containerd-shim") {
		t.Fatalf("parent %d of task pid %d is %q, not a shim", ppid, pid, cmd)
	}
	return ppid
}

// alive reports whether pid is a process that has not exited (a zombie
// has).
var alive = testnode.Alive
