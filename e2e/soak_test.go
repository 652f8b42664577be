package e2e

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/snapshots"
	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/internal/testnode"
	ctrdrt "github.com/noderun/noderun/runner/containerd"
)

// soakDuration is how long TestSoak keeps the load up (make soak
// DURATION=...); unset, the test is skipped.
func soakDuration(t *testing.T) time.Duration {
	t.Helper()
	v := os.Getenv("NODERUN_SOAK")
	if v == "" {
		t.Skip("soak test; set NODERUN_SOAK to a duration (make soak DURATION=2h)")
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < time.Minute {
		t.Fatalf("NODERUN_SOAK=%q: want a duration of a minute or more", v)
	}
	return d
}

// soakMetric is one sampled column and the growth it may show between the
// steady state after warm-up and the end of the run.
type soakMetric struct {
	name string
	// abs and pct: the end's value may exceed the start's by the larger
	// of abs and pct percent of the start.
	abs, pct float64
	// floor compares the windows' lowest samples instead of their
	// medians: a Go process's RSS jumps between levels as the scavenger
	// returns memory (the collector's between 7.5 and 17 MiB, minute to
	// minute), so a median follows the mix of levels, while a leak lifts
	// the lowest.
	floor bool
	// info: shown, never failed (a figure judged through another column).
	info bool
	why  string
}

// soakMetrics are checked at the end. Growth, not level, is the failure:
// a leak of one item per pod, watch or log stream grows by hundreds over
// a run with this churn, while the bounds leave room for the noise of a
// live process (GC cycles, connections and timers in flight).
var soakMetrics = []soakMetric{
	{"noderun_rss_kib", 8 << 10, 20, true, true, "anonymous plus file pages; the file pages are the binary's code and data paged in as paths run (up to its 30 MiB, shared and reclaimable), so growth is judged on anonymous RSS"},
	{"noderun_rss_anon_kib", 8 << 10, 20, true, false, "Go's heap and RSS breathe with GC; a leak per pod or stream outgrows 8 MiB in two hours"},
	{"noderun_heap_kib", 8 << 10, 20, true, true, "the Go heap's spans in use: live objects, garbage not yet collected and the free slots between them"},
	{"noderun_live_heap_kib", 4 << 10, 20, false, false, "the live Go heap, read after a collection the sample forces: a leak per pod or stream grows here, and nothing else does"},
	{"noderun_goroutines", 20, 10, false, false, "each pod, probe, stream and watch has goroutines that come and go"},
	{"noderun_fds", 10, 0, false, false, "connections and pipes in flight at the sample"},
	{"noderun_inotify", 0, 0, false, false, "inotify instances are made at start; any new one that stays is a leak"},
	{"noderun_threads", 8, 0, false, false, "Go keeps idle threads, so the count is the peak of blocking syscalls so far; a thread leaked per pod (a namespace holder) is hundreds"},
	{"collector_rss_kib", 8 << 10, 20, true, true, "as noderun's"},
	{"collector_rss_anon_kib", 8 << 10, 20, true, false, "as noderun's"},
	{"collector_fds", 10, 0, false, false, "3 a container: the churned pods come and go"},
	{"collector_inotify", 0, 0, false, false, "as noderun's"},
	{"collector_threads", 8, 0, false, false, "as noderun's"},
	{"snapshots_over_containers", 2, 0, false, false, "image layers plus one per container; one taken at a start in flight"},
	{"leases", 2, 0, false, false, "noderun's stock of create leases plus those of starts in flight"},
}

// soakColumns are the sample file's columns, in order.
var soakColumns = []string{"time", "elapsed_s",
	"noderun_rss_kib", "noderun_rss_anon_kib", "noderun_heap_kib", "noderun_live_heap_kib", "noderun_goroutines", "noderun_fds", "noderun_inotify", "noderun_threads",
	"collector_pid", "collector_rss_kib", "collector_rss_anon_kib", "collector_fds", "collector_inotify", "collector_threads",
	"pods", "restarts", "containers", "snapshots", "snapshots_over_containers", "leases",
	"churn_ops", "kills", "log_follows", "log_bytes", "watches", "watch_events", "errors"}

// soakCounts are what the load generators did so far.
type soakCounts struct {
	churn, kills, follows, logBytes, watches, watchEvents, errors atomic.Int64
}

// TestSoak keeps a node busy for NODERUN_SOAK (pod churn, crashing and
// killed containers, probes, log traffic, log follows and API watches),
// samples noderun's and its log collector's resources and containerd's
// leases and snapshots at intervals into a CSV file, and fails on growth
// beyond soakMetrics's bounds between the steady state after warm-up and
// the end of the run.
func TestSoak(t *testing.T) {
	dur := soakDuration(t)
	// A minute apart, or 30 samples in a shorter run.
	every := min(time.Minute, dur/30)
	n := newNode(t)
	out := soakOutput(t)
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fmt.Printf("soak: %s of load on noderun pid %d; samples every %s in %s\n", dur, n.proc.Process.Pid, every, out)
	t.Logf("samples in %s", out)
	fmt.Fprintln(f, strings.Join(soakColumns, ","))

	// The steady pods: a web server with httpGet and exec probes beside it
	// and a container that talks (log traffic) without pause.
	n.writeManifest("web.yaml", soakWebPod)
	n.writeManifest("talker.yaml", soakTalkerPod)
	n.waitPod("web", "Running", running)
	talker := n.waitPod("talker", "Running", running)
	base := soakStock(n)
	if base.err != nil {
		t.Fatal(base.err)
	}
	t.Logf("with the steady pods only: %d snapshots, %d containers, %d leases", base.snapshots, base.containers, base.leases)

	api := soakAPIClient(n)
	var c soakCounts
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	errf := func(format string, args ...any) {
		c.errors.Add(1)
		t.Errorf(format, args...)
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("random seed %d", seed)
	for i, load := range []func(context.Context, *rand.Rand){
		func(ctx context.Context, rng *rand.Rand) { soakChurn(ctx, rng, n, &c, errf) },
		func(ctx context.Context, rng *rand.Rand) { soakKills(ctx, rng, n, &c, errf) },
		func(ctx context.Context, rng *rand.Rand) {
			soakFollows(ctx, rng, api, talker.Namespace, talker.Name, &c, errf)
		},
		func(ctx context.Context, rng *rand.Rand) { soakWatches(ctx, rng, api, &c, errf) },
	} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			load(ctx, rand.New(rand.NewPCG(seed, uint64(i))))
		}()
	}

	start := time.Now()
	var samples []map[string]float64
	profiled := false
	for tick := time.NewTicker(every); ; {
		<-tick.C
		s := soakSample(n, &c)
		s["elapsed_s"] = time.Since(start).Seconds()
		samples = append(samples, s)
		row := []string{time.Now().UTC().Format(time.RFC3339)}
		for _, col := range soakColumns[1:] {
			row = append(row, strconv.FormatFloat(s[col], 'f', -1, 64))
		}
		fmt.Fprintln(f, strings.Join(row, ","))
		// Heap profiles where the summary's windows start and end, for
		// go tool pprof -base when a memory column grows.
		if !profiled && time.Since(start) >= dur/24 {
			profiled = soakHeapProfile(t, n, out, "start")
		}
		if !n.running() {
			cancel()
			wg.Wait()
			t.Fatalf("noderun exited after %s: %v", time.Since(start).Round(time.Second), n.proc.ProcessState)
		}
		if time.Since(start) >= dur {
			soakHeapProfile(t, n, out, "end")
			tick.Stop()
			break
		}
	}
	cancel()
	wg.Wait()
	t.Logf("load: %d churn operations, %d containers killed, %d log follows (%d bytes), %d watches (%d events), %d errors",
		c.churn.Load(), c.kills.Load(), c.follows.Load(), c.logBytes.Load(), c.watches.Load(), c.watchEvents.Load(), c.errors.Load())

	summary, failed := soakSummary(samples, dur)
	fmt.Print(summary)
	t.Log("\n" + summary)
	for _, m := range failed {
		t.Errorf("%s grew beyond its bound (see the table)", m)
	}

	// With the churned pods removed, containerd holds what it held with
	// the steady pods alone, and the previous run of a steady container
	// that restarted meanwhile (a probe failing on a loaded machine).
	soakRemoveChurn(n)
	deadline := time.Now().Add(2 * time.Minute)
	var end soakStockCount
	for {
		end = soakStock(n)
		kept := end.previous - base.previous
		if end.err == nil && end.snapshots == base.snapshots+kept && end.containers == base.containers+kept && end.leases <= base.leases {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("with the steady pods only again: %d snapshots, %d containers %v, %d leases (%v); %d, %d %v and %d before the churn",
				end.snapshots, end.containers, end.runs, end.leases, end.err, base.snapshots, base.containers, base.runs, base.leases)
			break
		}
		time.Sleep(time.Second)
	}
	t.Logf("back to the steady pods: %d snapshots, %d containers %v, %d leases; %d, %d %v and %d before the churn",
		end.snapshots, end.containers, end.runs, end.leases, base.snapshots, base.containers, base.runs, base.leases)
}

// TestSoakCheck judges a finished run's sample file again (make soak-check
// CSV=...), by the bounds as they are now; the run's duration is its last
// sample's time unless NODERUN_SOAK gives it.
func TestSoakCheck(t *testing.T) {
	path := os.Getenv("NODERUN_SOAK_CHECK")
	if path == "" {
		t.Skip("set NODERUN_SOAK_CHECK to a soak's sample file")
	}
	samples, err := readSoakCSV(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(samples) == 0 {
		t.Fatalf("%s holds no samples", path)
	}
	dur := (time.Duration(samples[len(samples)-1]["elapsed_s"]) * time.Second).Round(time.Minute)
	if v := os.Getenv("NODERUN_SOAK"); v != "" {
		if dur, err = time.ParseDuration(v); err != nil {
			t.Fatalf("NODERUN_SOAK=%q: %v", v, err)
		}
	}
	summary, failed := soakSummary(samples, dur)
	fmt.Print(summary)
	for _, m := range failed {
		t.Errorf("%s grew beyond its bound (see the table)", m)
	}
}

// readSoakCSV reads a sample file as TestSoak writes it.
func readSoakCSV(path string) ([]map[string]float64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("%s: empty", path)
	}
	var out []map[string]float64
	for i, row := range rows[1:] {
		s := map[string]float64{}
		for j, col := range rows[0] {
			if col == "time" {
				continue
			}
			if s[col], err = strconv.ParseFloat(row[j], 64); err != nil {
				return nil, fmt.Errorf("%s: line %d, %s: %v", path, i+2, col, err)
			}
		}
		out = append(out, s)
	}
	return out, nil
}

// soakOutput is the sample file: NODERUN_SOAK_OUT, or one named by the
// start time under soak-results/ in the checkout.
func soakOutput(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("NODERUN_SOAK_OUT"); p != "" {
		return p
	}
	dir, err := filepath.Abs(filepath.Join("..", "soak-results"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "soak-"+time.Now().UTC().Format("20060102-150405")+".csv")
}

const soakWebPod = `apiVersion: v1
kind: Pod
metadata: {name: web}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: web
    image: busybox:1.36
    command: ["sh", "-c", "mkdir -p /www && echo ok > /www/index.html && exec httpd -f -p 8080 -h /www"]
    ports: [{containerPort: 8080}]
    readinessProbe: {httpGet: {path: /, port: 8080}, periodSeconds: 2}
    livenessProbe: {httpGet: {path: /, port: 8080}, periodSeconds: 3}
  - name: side
    image: busybox:1.36
    command: ["sh", "-c", "touch /tmp/ok; trap 'exit 0' TERM; sleep 3600 & wait"]
    readinessProbe: {exec: {command: ["test", "-e", "/tmp/ok"]}, periodSeconds: 2}
    livenessProbe: {exec: {command: ["cat", "/tmp/ok"]}, periodSeconds: 3}
`

// soakTalkerPod prints about 20 lines a second, on stdout and stderr.
const soakTalkerPod = `apiVersion: v1
kind: Pod
metadata: {name: talker}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", "trap 'exit 0' TERM; i=0; while :; do i=$((i+1)); echo line $i; [ $((i % 10)) = 0 ] && echo err $i >&2; sleep 0.05 & wait; done"]
`

// soakChurnPod is one generation of a churned pod; kind picks what it
// does: crash after a few seconds (restarts with back-off), fail its
// liveness probe now and then (restarts by the probe), or talk and idle.
func soakChurnPod(name string, gen, kind int) string {
	var body string
	switch kind {
	case 0:
		body = `
    command: ["sh", "-c", "echo starting; sleep 3; echo crashing >&2; exit 1"]`
	case 1:
		body = `
    command: ["sh", "-c", "touch /tmp/live; trap 'exit 0' TERM; (sleep 20; rm /tmp/live) & sleep 3600 & wait"]
    livenessProbe: {exec: {command: ["test", "-e", "/tmp/live"]}, periodSeconds: 2, failureThreshold: 1}
    readinessProbe: {exec: {command: ["true"]}, periodSeconds: 2}`
	default:
		body = `
    command: ["sh", "-c", "trap 'exit 0' TERM; i=0; while :; do i=$((i+1)); echo tick $i; sleep 0.5 & wait; done"]
    readinessProbe: {exec: {command: ["true"]}, periodSeconds: 3}`
	}
	return genPod(name, gen, body)
}

const soakChurnSlots = 4

// soakChurn adds, edits and removes pods every few seconds.
func soakChurn(ctx context.Context, rng *rand.Rand, n *node, c *soakCounts, errf func(string, ...any)) {
	gens := make([]int, soakChurnSlots)
	for sleepCtx(ctx, time.Duration(3000+rng.IntN(7000))*time.Millisecond) {
		i := rng.IntN(soakChurnSlots)
		name := fmt.Sprintf("churn%d", i)
		path := filepath.Join(n.podsDir, name+".yaml")
		var err error
		if _, statErr := os.Stat(path); statErr == nil && rng.IntN(3) == 0 {
			err = os.Remove(path)
		} else {
			gens[i]++
			err = writeFileAtomic(path, soakChurnPod(name, gens[i], rng.IntN(3)))
		}
		if err != nil {
			errf("churn: %v", err)
			continue
		}
		c.churn.Add(1)
	}
}

func soakRemoveChurn(n *node) {
	for i := range soakChurnSlots {
		_ = os.Remove(filepath.Join(n.podsDir, fmt.Sprintf("churn%d.yaml", i)))
	}
}

// writeFileAtomic writes via a dot-file and a rename, as writeManifest,
// for goroutines that may not end the test.
func writeFileAtomic(path, content string) error {
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// soakKills kills a running container of a churned pod, as the OOM killer
// or an operator would, about every 30 s.
func soakKills(ctx context.Context, rng *rand.Rand, n *node, c *soakCounts, errf func(string, ...any)) {
	for sleepCtx(ctx, time.Duration(20+rng.IntN(20))*time.Second) {
		cs, err := client.ContainerService().List(n.ctx(), fmt.Sprintf(`labels."%s"~="^churn"`, ctrdrt.LabelPodName))
		if err != nil {
			errf("kills: list containers: %v", err)
			continue
		}
		rng.Shuffle(len(cs), func(i, j int) { cs[i], cs[j] = cs[j], cs[i] })
		for _, ct := range cs {
			tk, err := client.LoadContainer(n.ctx(), ct.ID)
			if err != nil {
				continue // removed meanwhile
			}
			task, err := tk.Task(n.ctx(), nil)
			if err != nil {
				continue
			}
			if st, err := task.Status(n.ctx()); err != nil || st.Status != containerd.Running {
				continue
			}
			if err := syscall.Kill(int(task.Pid()), syscall.SIGKILL); err == nil {
				c.kills.Add(1)
				break
			}
		}
	}
}

// soakAPI reaches the node's Kubernetes API with the view token.
type soakAPI struct {
	server, token string
	hc            *http.Client
}

func soakAPIClient(n *node) *soakAPI {
	n.t.Helper()
	ca, token := n.viewCreds()
	// No client timeout: streams are ended by their contexts.
	return &soakAPI{server: n.apiServer(), token: token, hc: trustingClient(ca, 0)}
}

// stream GETs path and reads the body until ctx ends it; it returns the
// bytes read and the error of anything but that end.
func (a *soakAPI) stream(ctx context.Context, path string, each func([]byte)) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.server+path, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	resp, err := a.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return 0, nil
		}
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return 0, fmt.Errorf("GET %s: %s: %s", path, resp.Status, b)
	}
	var total int64
	buf := make([]byte, 32<<10)
	for {
		k, err := resp.Body.Read(buf)
		total += int64(k)
		if k > 0 && each != nil {
			each(buf[:k])
		}
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, io.EOF) {
				return total, nil
			}
			return total, err
		}
	}
}

// soakFollows opens `logs -f` streams of the talker, up to two at a time,
// each closed after 1 to 20 s.
func soakFollows(ctx context.Context, rng *rand.Rand, a *soakAPI, ns, pod string, c *soakCounts, errf func(string, ...any)) {
	var wg sync.WaitGroup
	defer wg.Wait()
	sem := make(chan struct{}, 2)
	for sleepCtx(ctx, time.Duration(1000+rng.IntN(4000))*time.Millisecond) {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		hold := time.Duration(1000+rng.IntN(19000)) * time.Millisecond
		path := fmt.Sprintf("/api/v1/namespaces/%s/pods/%s/log?container=main&follow=true&tailLines=%d", ns, pod, rng.IntN(50))
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			sctx, cancel := context.WithTimeout(ctx, hold)
			defer cancel()
			got, err := a.stream(sctx, path, nil)
			c.follows.Add(1)
			c.logBytes.Add(got)
			if err != nil {
				errf("logs -f: %v", err)
			} else if got == 0 && hold >= 5*time.Second && ctx.Err() == nil {
				errf("logs -f of the talker for %s read nothing", hold)
			}
		}()
	}
}

// soakWatches opens pod and event watches, up to three at a time, each
// closed after 1 to 30 s.
func soakWatches(ctx context.Context, rng *rand.Rand, a *soakAPI, c *soakCounts, errf func(string, ...any)) {
	var wg sync.WaitGroup
	defer wg.Wait()
	sem := make(chan struct{}, 3)
	paths := []string{"/api/v1/pods?watch=true", "/api/v1/namespaces/default/pods?watch=true", "/api/v1/events?watch=true"}
	for sleepCtx(ctx, time.Duration(1000+rng.IntN(3000))*time.Millisecond) {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		hold := time.Duration(1000+rng.IntN(29000)) * time.Millisecond
		path := paths[rng.IntN(len(paths))]
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			sctx, cancel := context.WithTimeout(ctx, hold)
			defer cancel()
			var events int64
			_, err := a.stream(sctx, path, func(b []byte) { events += int64(strings.Count(string(b), "\n")) })
			c.watches.Add(1)
			c.watchEvents.Add(events)
			if err != nil {
				errf("watch %s: %v", path, err)
			}
		}()
	}
}

// sleepCtx sleeps d and reports whether ctx is still live.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// soakStockCount is what containerd holds in the node's namespace.
type soakStockCount struct {
	containers, snapshots, leases int
	// previous counts the containers kept as a container's previous run
	// (the kubelet keeps one for kubectl logs --previous); runs names
	// every container as pod/container#restart.
	previous int
	runs     []string
	err      error
}

func soakStock(n *node) soakStockCount {
	ctx, cancel := context.WithTimeout(n.ctx(), 20*time.Second)
	defer cancel()
	var s soakStockCount
	cs, err := client.ContainerService().List(ctx)
	if err != nil {
		return soakStockCount{err: err}
	}
	s.containers = len(cs)
	seen := map[string]bool{}
	for _, c := range cs {
		name := c.Labels[ctrdrt.LabelPodName] + "/" + c.Labels[ctrdrt.LabelContainer]
		s.runs = append(s.runs, name+"#"+c.Labels[ctrdrt.LabelRestartCount])
		if seen[name] {
			s.previous++
		}
		seen[name] = true
	}
	slices.Sort(s.runs)
	if err := client.SnapshotService(snapshotter).Walk(ctx, func(context.Context, snapshots.Info) error {
		s.snapshots++
		return nil
	}); err != nil {
		return soakStockCount{err: err}
	}
	ls, err := client.LeasesService().List(ctx)
	if err != nil {
		return soakStockCount{err: err}
	}
	s.leases = len(ls)
	return s
}

// soakHeapProfile saves noderun's heap profile beside the sample file.
func soakHeapProfile(t *testing.T, n *node, out, at string) bool {
	var body string
	if err := n.get("/debug/pprof/heap", &body); err != nil {
		t.Logf("heap profile at the %s: %v", at, err)
		return false
	}
	p := strings.TrimSuffix(out, ".csv") + ".heap-" + at + ".pb.gz"
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Logf("heap profile at the %s: %v", at, err)
		return false
	}
	t.Logf("heap profile at the %s: %s", at, p)
	return true
}

var (
	heapInuse = regexp.MustCompile(`(?m)^# HeapInuse = (\d+)$`)
	heapAlloc = regexp.MustCompile(`(?m)^# HeapAlloc = (\d+)$`)
)

// soakSample reads one row; a value it cannot read is -1 (and an error is
// counted), so that one bad read does not end a long run.
func soakSample(n *node, c *soakCounts) map[string]float64 {
	s := map[string]float64{}
	pid := n.proc.Process.Pid
	proc := readProc(pid)
	s["noderun_rss_kib"], s["noderun_rss_anon_kib"], s["noderun_fds"], s["noderun_inotify"], s["noderun_threads"] = proc.rss, proc.anon, proc.fds, proc.inotify, proc.threads
	s["noderun_goroutines"], s["noderun_heap_kib"], s["noderun_live_heap_kib"] = -1, -1, -1
	var body string
	// gc=1: the runtime collects first, so HeapAlloc is the live heap.
	if err := n.get("/debug/pprof/heap?gc=1&debug=1", &body); err == nil {
		for col, re := range map[string]*regexp.Regexp{"noderun_heap_kib": heapInuse, "noderun_live_heap_kib": heapAlloc} {
			if m := re.FindStringSubmatch(body); m != nil {
				b, _ := strconv.ParseFloat(m[1], 64)
				s[col] = b / 1024
			}
		}
	}
	if err := n.get("/debug/pprof/goroutine?debug=1", &body); err == nil {
		if m := goroutineTotal.FindStringSubmatch(body); m != nil {
			s["noderun_goroutines"], _ = strconv.ParseFloat(m[1], 64)
		}
	}
	cpid := n.collectorPID()
	s["collector_pid"] = float64(cpid)
	cproc := procCounts{-1, -1, -1, -1, -1}
	if cpid != 0 {
		cproc = readProc(cpid)
	}
	s["collector_rss_kib"], s["collector_rss_anon_kib"], s["collector_fds"], s["collector_inotify"], s["collector_threads"] = cproc.rss, cproc.anon, cproc.fds, cproc.inotify, cproc.threads
	st := soakStock(n)
	if st.err != nil {
		st = soakStockCount{containers: -1, snapshots: -1, leases: -1}
	}
	s["containers"], s["snapshots"], s["leases"] = float64(st.containers), float64(st.snapshots), float64(st.leases)
	s["snapshots_over_containers"] = float64(st.snapshots - st.containers)
	var list v1.PodList
	s["pods"], s["restarts"] = -1, -1
	if err := n.get("/pods", &list); err == nil {
		// restarts: of the pods listed now, so it drops as churned pods go.
		s["pods"], s["restarts"] = float64(len(list.Items)), 0
		for _, p := range list.Items {
			for _, cs := range p.Status.ContainerStatuses {
				s["restarts"] += float64(cs.RestartCount)
			}
		}
	}
	s["churn_ops"], s["kills"] = float64(c.churn.Load()), float64(c.kills.Load())
	s["log_follows"], s["log_bytes"] = float64(c.follows.Load()), float64(c.logBytes.Load())
	s["watches"], s["watch_events"] = float64(c.watches.Load()), float64(c.watchEvents.Load())
	s["errors"] = float64(c.errors.Load())
	return s
}

// procCounts are a process's resident memory (KiB), its anonymous part, open fds, inotify
// instances among them, and threads; -1 where unreadable.
type procCounts struct{ rss, anon, fds, inotify, threads float64 }

func readProc(pid int) procCounts {
	p := procCounts{-1, -1, -1, -1, -1}
	if v, err := testnode.StatusValues(pid, "VmRSS", "RssAnon", "Threads"); err == nil {
		p.rss, p.anon, p.threads = v["VmRSS"], v["RssAnon"], v["Threads"]
	}
	if fds, inotify, err := testnode.FDs(pid); err == nil {
		p.fds, p.inotify = float64(fds), float64(inotify)
	}
	return p
}

// soakSummary compares the steady state after warm-up (the samples from
// 1/24 to 1/8 of the run: minutes 5 to 15 of two hours) with the end (the
// last twelfth: its last 10 minutes), per metric by the windows' medians
// or floors, and returns the table and the metrics beyond their bounds.
func soakSummary(samples []map[string]float64, dur time.Duration) (string, []string) {
	window := func(from, to float64) []map[string]float64 {
		var w []map[string]float64
		for _, s := range samples {
			if e := s["elapsed_s"]; e >= from && e <= to {
				w = append(w, s)
			}
		}
		return w
	}
	d := dur.Seconds()
	early, late := window(d/24, d/8), window(d-d/12, 2*d)
	var b strings.Builder
	fmt.Fprintf(&b, "soak summary: %d samples; start = median (RSS: lowest) of %d samples at %s-%s, end = of the last %d\n",
		len(samples), len(early), (dur / 24).Round(time.Second), (dur / 8).Round(time.Second), len(late))
	fmt.Fprintf(&b, "%-26s %12s %12s %12s %12s  %s\n", "metric", "start", "end", "growth", "bound", "result")
	var failed []string
	for _, m := range soakMetrics {
		stat := median
		if m.floor {
			stat = lowest
		}
		start, end := stat(early, m.name), stat(late, m.name)
		bound := max(m.abs, start*m.pct/100)
		result := "pass"
		switch {
		case !recorded(samples, m.name):
			result = "not in this file" // a run before the column was added
		case len(early) == 0 || len(late) == 0:
			result = "FAIL (no samples)"
		case start < 0 || end < 0:
			result = "FAIL (not read)"
		case m.info:
			result = "info"
		case end-start > bound:
			result = "FAIL"
		}
		if strings.HasPrefix(result, "FAIL") {
			failed = append(failed, m.name)
		}
		fmt.Fprintf(&b, "%-26s %12.1f %12.1f %+12.1f %12s  %s\n", m.name, start, end, end-start, "+"+strconv.FormatFloat(bound, 'f', 0, 64), result)
	}
	return b.String(), failed
}

// recorded reports whether the samples hold a column.
func recorded(samples []map[string]float64, col string) bool {
	for _, s := range samples {
		if _, ok := s[col]; ok {
			return true
		}
	}
	return false
}

// lowest of a column over samples; -1 as median.
func lowest(samples []map[string]float64, col string) float64 {
	v := median(samples, col)
	for _, s := range samples {
		if v >= 0 {
			v = min(v, s[col])
		}
	}
	return v
}

// median of a column over samples; -1 if any sample could not read it
// or there are none.
func median(samples []map[string]float64, col string) float64 {
	var v []float64
	for _, s := range samples {
		if s[col] < 0 {
			return -1
		}
		v = append(v, s[col])
	}
	if len(v) == 0 {
		return -1
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

// soakSummary compares the medians of its two windows: a spike inside a
// window does not fail the run, growth that stays does, and a value that
// could not be read fails as such.
func TestSoakSummary(t *testing.T) {
	const dur = 120 * time.Minute
	run := func(at func(min int) (rss, fds float64)) (string, []string) {
		var samples []map[string]float64
		for m := 1; m <= 120; m++ {
			rss, fds := at(m)
			s := map[string]float64{"elapsed_s": float64(m * 60), "noderun_rss_anon_kib": rss, "noderun_fds": fds}
			for _, metric := range soakMetrics {
				if _, ok := s[metric.name]; !ok {
					s[metric.name] = 10
				}
			}
			samples = append(samples, s)
		}
		return soakSummary(samples, dur)
	}
	steady := func(m int) (float64, float64) {
		if m%7 == 0 {
			return 400 << 10, 100 // spikes, in both windows
		}
		return 40 << 10, 30
	}
	if table, failed := run(steady); len(failed) > 0 {
		t.Errorf("a steady run with spikes failed %v:\n%s", failed, table)
	}
	// From minute 60 on, 12 MiB and 11 fds more: beyond the 8 MiB (20% of
	// 40 MiB is less) and the 10 fds allowed.
	grown := func(m int) (float64, float64) {
		if m >= 60 {
			return 52 << 10, 41
		}
		return 40 << 10, 30
	}
	if table, failed := run(grown); !slices.Equal(failed, []string{"noderun_rss_anon_kib", "noderun_fds"}) {
		t.Errorf("growth beyond the bounds: failed %v, want RSS and fds:\n%s", failed, table)
	}
	// Total RSS growing (the binary's pages paged in) is shown, not failed.
	var samples []map[string]float64
	for m := 1; m <= 120; m++ {
		s := map[string]float64{"elapsed_s": float64(m * 60), "noderun_rss_kib": float64(20<<10 + m*100)}
		for _, metric := range soakMetrics {
			if _, ok := s[metric.name]; !ok {
				s[metric.name] = 10
			}
		}
		samples = append(samples, s)
	}
	if table, failed := soakSummary(samples, dur); len(failed) > 0 || !strings.Contains(table, "info") {
		t.Errorf("total RSS growth: failed %v, want it shown as info:\n%s", failed, table)
	}
	// The collector's RSS as seen in a run: two levels, in changing mix.
	levels := func(m int) (float64, float64) {
		if m%3 == 0 || m > 110 && m%4 != 0 {
			return 16800, 30
		}
		return 7600, 30
	}
	if table, failed := run(levels); len(failed) > 0 {
		t.Errorf("RSS between two levels, more often the higher at the end, failed %v:\n%s", failed, table)
	}
	unread := func(m int) (float64, float64) {
		if m == 115 {
			return -1, 30
		}
		return 40 << 10, 30
	}
	if table, failed := run(unread); !slices.Equal(failed, []string{"noderun_rss_anon_kib"}) || !strings.Contains(table, "FAIL (not read)") {
		t.Errorf("a sample not read at the end: failed %v, want RSS, not read:\n%s", failed, table)
	}
}
