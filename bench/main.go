// Command bench measures noderun against the floor: the same pod work done
// directly with containerd's client and libcni, in the same run, against a
// private containerd and CNI network. It prints one Markdown table and writes
// the same figures as JSON. Run it as root with `make bench`; with -profile
// it instead writes noderun's CPU and heap profiles around a burst.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Config says how much to measure and where the bench's network lives.
type Config struct {
	Runs      int           `json:"runs"`       // one-pod repetitions
	BurstRuns int           `json:"burst_runs"` // repetitions of each burst and its teardown
	InitRuns  int           `json:"init_runs"`  // repetitions of the pod with init containers
	Bursts    []int         `json:"bursts"`     // burst sizes
	CPUWindow time.Duration `json:"cpu_window_ns"`
	APIGets   int           `json:"api_gets"`      // timed GET /pods at the largest burst
	ProbePods int           `json:"probe_pods"`    // pods per probe CPU measure (0: none)
	LogWindow time.Duration `json:"log_window_ns"` // log throughput measure (0: none)
	// Multi-container pods for the shim measures (0 pods: none).
	ShimPods       int `json:"shim_pods"`
	ShimContainers int `json:"shim_containers"`
	// Tarballs in the images dir for the start-time measure (0: none).
	ImageTarballs   int `json:"image_tarballs"`
	ImageTarballMiB int `json:"image_tarball_mib"`
	// NodeLog, if set, is where the measured noderun logs at debug level
	// (each pod's phase timings), kept after the run.
	NodeLog string `json:"node_log,omitempty"`
	// RunStateOnDisk keeps run-time state on the bench dir's filesystem
	// instead of a tmpfs (see env.runState).
	RunStateOnDisk bool `json:"run_state_on_disk"`
	// StateOnHostFS keeps the persistent state on /tmp's filesystem instead
	// of a journaled ext4 of the bench's own (see env.diskState).
	StateOnHostFS bool      `json:"state_on_host_fs"`
	Bridge        string    `json:"bridge"`
	Subnet        string    `json:"subnet"`
	Log           io.Writer `json:"-"` // progress
}

// defaultConfig keeps a full run under 20 minutes on 2 cores. 27 one-pod
// runs, because the ratio of 9 pairs' medians swung by ±0.06 from run to
// run on this VM, more than the one-pod target leaves.
func defaultConfig() Config {
	return Config{
		Runs: 27, BurstRuns: 5, InitRuns: 5, Bursts: []int{10, 30, 100}, CPUWindow: time.Minute, LogWindow: 10 * time.Second, APIGets: 30, ProbePods: 100, ShimPods: 10, ShimContainers: 3, ImageTarballs: 5, ImageTarballMiB: 40,
		Bridge: "nrbench0", Subnet: "10.213.0.0/16", Log: os.Stderr,
	}
}

func main() {
	cfg := defaultConfig()
	out := flag.String("out", "bench-results/latest.json", "write the results as JSON here")
	profileDir := flag.String("profile", "", "instead of measuring, write noderun's CPU and heap profiles around a burst into this dir")
	profilePods := flag.Int("profile-pods", 100, "burst size for -profile")
	profileSecs := flag.Int("profile-seconds", 40, "CPU profile length for -profile; covers the burst's start and teardown")
	profileProbes := flag.Bool("profile-probes", false, "-profile: profile -probe-pods pods with httpGet readiness probes every second, steady, instead of a burst")
	bursts := flag.String("bursts", "10,30,100", "burst sizes, comma-separated")
	flag.IntVar(&cfg.Runs, "runs", cfg.Runs, "one-pod repetitions")
	flag.IntVar(&cfg.BurstRuns, "burst-runs", cfg.BurstRuns, "repetitions of each burst")
	flag.IntVar(&cfg.InitRuns, "init-runs", cfg.InitRuns, "repetitions of the pod with 3 init and 2 app containers (0: skip it)")
	flag.DurationVar(&cfg.CPUWindow, "cpu-window", cfg.CPUWindow, "steady-state window for noderun's CPU use")
	flag.DurationVar(&cfg.LogWindow, "log-window", cfg.LogWindow, "one container logging as fast as it can, this long (0: skip it)")
	flag.IntVar(&cfg.ProbePods, "probe-pods", cfg.ProbePods, "pods with probes for the probe CPU measures (0: skip them)")
	flag.IntVar(&cfg.ShimPods, "shim-pods", cfg.ShimPods, "pods of -shim-containers containers for the shim measures (0: skip them)")
	flag.IntVar(&cfg.ShimContainers, "shim-containers", cfg.ShimContainers, "containers per pod for the shim measures")
	flag.IntVar(&cfg.ImageTarballs, "image-tarballs", cfg.ImageTarballs, "large tarballs in the images dir for the start-time measure (0: skip it)")
	flag.StringVar(&cfg.NodeLog, "node-log", "", "keep the measured noderun's debug log (each pod's phase timings) in this file")
	flag.BoolVar(&cfg.RunStateOnDisk, "run-state-on-disk", false, "keep run-time state (containerd's state dir, runc roots, pinned namespaces, noderun's --run-dir) on disk, not on a tmpfs as /run is on a normal host")
	flag.BoolVar(&cfg.StateOnHostFS, "state-on-host-fs", false, "keep persistent state (containerd's root, noderun's state and log dirs, the CNI leases) on /tmp's filesystem, not on an ext4 with a journal the bench makes, as /var/lib usually is")
	flag.StringVar(&cfg.Bridge, "bridge", cfg.Bridge, "bridge the bench's CNI network creates")
	flag.StringVar(&cfg.Subnet, "subnet", cfg.Subnet, "the bench's pod subnet")
	peersRun := flag.Bool("peers", false, "instead, measure noderun, the floor, the kubelet (standalone, static pods) and podman kube play side by side (issue 40)")
	pc := peersFlags()
	peerSystems := flag.String("peers-systems", strings.Join(allSystems, ","), "-peers: the systems to measure beside noderun, comma-separated")
	peersOut := flag.String("peers-out", "bench-results/peers.md", "-peers: write the table here too")
	flag.Parse()
	var err error
	if cfg.Bursts, err = parseSizes(*bursts); err != nil {
		fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if *peersRun {
		pc.Bursts = cfg.Bursts
		if pc.Systems, err = parseSystems(*peerSystems); err != nil {
			fatal(err)
		}
		// The table, if measuring finished, even when the cleanup after
		// it failed.
		table, err := runPeers(ctx, cfg, *pc)
		if table != "" {
			fmt.Print(table)
			err = errors.Join(err, os.MkdirAll(filepath.Dir(*peersOut), 0o755))
			err = errors.Join(err, os.WriteFile(*peersOut, []byte(table), 0o644))
		}
		if err != nil {
			fatal(err)
		}
		return
	}
	if *profileDir != "" {
		prof := profile
		if *profileProbes {
			prof = profileProbing
		}
		if err := prof(ctx, cfg, *profileDir, *profilePods, *profileSecs); err != nil {
			fatal(err)
		}
		return
	}
	rep, err := run(ctx, cfg)
	if err != nil {
		fatal(err)
	}
	rep.writeTable(os.Stdout)
	if err := rep.writeJSON(*out); err != nil {
		fatal(err)
	}
	fmt.Println("\nJSON:", *out)
}

// peersFlags defines the -peers-* repetition flags.
func peersFlags() *PeersConfig {
	// The peers' repetitions keep a warm run near 30 minutes on a busy
	// 2-core machine: the kubelet and podman take minutes for a burst of
	// 100 pods, podman a minute for the pod with init containers.
	pc := &PeersConfig{Runs: 3, BurstRuns: 2, BigBurstRuns: 1, PSSPods: []int{30, 100}, InitRuns: 2, CrashRuns: 2, RebootRuns: 1, RebootPods: 30,
		ProbePods: 100, CPUWindow: 30 * time.Second, KubeSubnet: "10.216.0.0/16", PodmanSubnet: "10.217.0.0/16"}
	flag.IntVar(&pc.Runs, "peers-runs", pc.Runs, "-peers: one-pod repetitions per system")
	flag.IntVar(&pc.BurstRuns, "peers-burst-runs", pc.BurstRuns, "-peers: repetitions of each burst per system")
	flag.IntVar(&pc.BigBurstRuns, "peers-big-burst-runs", pc.BigBurstRuns, "-peers: repetitions of each burst of 100 pods or more per system")
	flag.IntVar(&pc.InitRuns, "peers-init-runs", pc.InitRuns, "-peers: repetitions of the pod with init containers per system")
	flag.IntVar(&pc.CrashRuns, "peers-crash-runs", pc.CrashRuns, "-peers: repetitions of the crashed container's restart per system")
	flag.IntVar(&pc.RebootRuns, "peers-reboot-runs", pc.RebootRuns, "-peers: repetitions of the reboot recovery per system")
	flag.IntVar(&pc.RebootPods, "peers-reboot-pods", pc.RebootPods, "-peers: pods brought back by the reboot recovery")
	flag.IntVar(&pc.ProbePods, "peers-probe-pods", pc.ProbePods, "-peers: pods with httpGet probes every second for the probe CPU (0: skip it)")
	flag.DurationVar(&pc.CPUWindow, "peers-cpu-window", pc.CPUWindow, "-peers: window of the probe and idle CPU measures")
	return pc
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "bench:", err)
	os.Exit(1)
}

// parseSystems reads -peers-systems: known names, noderun always
// included, in allSystems' order.
func parseSystems(s string) ([]string, error) {
	want := strings.Split(s, ",")
	for _, w := range want {
		if !slices.Contains(allSystems, strings.TrimSpace(w)) {
			return nil, fmt.Errorf("-peers-systems: %q is not one of %s", w, strings.Join(allSystems, ", "))
		}
	}
	var out []string
	for _, sys := range allSystems {
		if sys == sysNoderun || slices.ContainsFunc(want, func(w string) bool { return strings.TrimSpace(w) == sys }) {
			out = append(out, sys)
		}
	}
	return out, nil
}

func parseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-bursts: %q is not a pod count", f)
		}
		out = append(out, n)
	}
	slices.Sort(out)
	return out, nil
}

// setup brings up the environment, the floor, noderun and one event
// watcher per namespace; teardown undoes all of it, even after a failure.
func setup(ctx context.Context, cfg Config) (b *bench, teardown func() error, err error) {
	if m := missingPrerequisite(); m != "" {
		return nil, nil, fmt.Errorf("missing prerequisite: %s", m)
	}
	cfg.Log = orDiscard(cfg.Log)
	fmt.Fprintln(cfg.Log, "bench: building noderun, starting containerd")
	e, err := newEnv(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	b = &bench{cfg: cfg, env: e, m: measurements{
		burst: map[int]*pair{}, burstCPU: map[int]*pair{}, teardown: map[int]*pair{}, rss: map[int][]float64{}, anon: map[int][]float64{}, heap: map[int][]float64{}, pss: map[int][]nodePSS{},
	}}
	watchCtx, stopWatch := context.WithCancel(context.WithoutCancel(ctx))
	teardown = func() error {
		var errs []error
		if b.node != nil {
			errs = append(errs, b.stopNode())
		}
		stopWatch()
		return errors.Join(append(errs, e.close())...)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, teardown())
		}
	}()
	b.fw = newWatcher(watchCtx, e.client, floorNS)
	b.nw = newWatcher(watchCtx, e.client, noderunNS)
	if b.floor, err = newFloor(ctx, e); err != nil {
		return nil, nil, err
	}
	if b.node, err = startNode(ctx, e); err != nil {
		return nil, nil, err
	}
	return b, teardown, nil
}

// stopNode lets noderun remove whatever pods are left, then stops it;
// env.close removes anything it could not.
func (b *bench) stopNode() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b.node.removeAllManifests()
	var err error
	if b.node.proc.Running() {
		err = b.node.waitNoPods(ctx, time.Minute)
	}
	b.node.stop()
	return err
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

// run measures everything in cfg and returns the report.
func run(ctx context.Context, cfg Config) (rep *Report, retErr error) {
	loadBefore := loadAvg()
	b, teardown, err := setup(ctx, cfg)
	if err != nil {
		return nil, err
	}
	rep = &Report{Time: time.Now().UTC(), Config: b.cfg, dir: b.env.dir, containerdPID: b.env.daemon.PID()}
	rep.Machine = machineInfo(ctx, b.env.client)
	defer func() { retErr = errors.Join(retErr, teardown()) }()
	info, err := os.Stat(b.env.bin)
	if err != nil {
		return rep, err
	}
	b.m.binaryMiB = float64(info.Size()) / mib
	if err := b.measureAll(ctx); err != nil {
		return rep, err
	}
	rep.Machine.LoadBefore, rep.Machine.HostBusy = loadBefore, b.m.hostBusyPercent
	rep.Rows = append(b.m.rows(b.cfg), b.m.kubeRows(b.kube, b.cfg)...)
	return rep, nil
}

// setupIn is setup for a profile written into dir.
func setupIn(ctx context.Context, cfg Config, dir string) (*bench, func() error, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, err
	}
	return setup(ctx, cfg)
}

// profile starts a CPU profile of noderun, runs one burst and its teardown
// meanwhile, takes heap and goroutine profiles while the pods run, and
// writes them into dir.
func profile(ctx context.Context, cfg Config, dir string, pods, seconds int) (retErr error) {
	b, teardown, err := setupIn(ctx, cfg, dir)
	if err != nil {
		return err
	}
	defer func() { retErr = errors.Join(retErr, teardown()) }()
	cpuPath, heapPath := filepath.Join(dir, "noderun-cpu.pprof"), filepath.Join(dir, "noderun-heap.pprof")
	goroutinesPath := filepath.Join(dir, "noderun-goroutines.txt")
	cpuDone := make(chan error, 1)
	go func() { cpuDone <- b.node.save(ctx, fmt.Sprintf("/debug/pprof/profile?seconds=%d", seconds), cpuPath) }()
	b.logf("CPU profile for %d s around a burst of %d pods", seconds, pods)
	start, down, err := b.nodePods(ctx, "prof", pods, nil, nil, func([]string) error {
		return errors.Join(b.node.save(ctx, "/debug/pprof/heap", heapPath),
			b.node.save(ctx, "/debug/pprof/goroutine?debug=1", goroutinesPath))
	})
	if err != nil {
		return err
	}
	if err := <-cpuDone; err != nil {
		return err
	}
	fmt.Printf("burst of %d (profiled): all running after %.3f s, all gone %.3f s after removal\n",
		pods, start.Seconds(), down.Seconds())
	fmt.Printf("profiles: %s %s %s\nview: go tool pprof -top %s\n", cpuPath, heapPath, goroutinesPath, cpuPath)
	return nil
}

// profileProbing writes noderun's CPU profile (seconds long) and heap
// profile while cfg.ProbePods pods are probed by httpGet every second and
// nothing else happens: where a probe's CPU goes.
func profileProbing(ctx context.Context, cfg Config, dir string, _, seconds int) (retErr error) {
	b, teardown, err := setupIn(ctx, cfg, dir)
	if err != nil {
		return err
	}
	defer func() { retErr = errors.Join(retErr, teardown()) }()
	names := podNames("pp", cfg.ProbePods)
	if _, err := b.node.writeManifestsWith(names, httpProbed); err != nil {
		return err
	}
	if err := b.node.waitReady(ctx, names, waitTimeout); err != nil {
		return err
	}
	if err := sleep(ctx, settle); err != nil {
		return err
	}
	b.logf("CPU profile for %d s of %d pods probed every second", seconds, cfg.ProbePods)
	cpu0, err := b.node.cpuTime()
	if err != nil {
		return err
	}
	t0 := time.Now()
	cpuPath, heapPath := filepath.Join(dir, "noderun-cpu.pprof"), filepath.Join(dir, "noderun-heap.pprof")
	if err := b.node.save(ctx, fmt.Sprintf("/debug/pprof/profile?seconds=%d", seconds), cpuPath); err != nil {
		return err
	}
	cpu1, err := b.node.cpuTime()
	if err != nil {
		return err
	}
	if err := b.node.save(ctx, "/debug/pprof/heap", heapPath); err != nil {
		return err
	}
	cpu := 100 * float64(cpu1-cpu0) / float64(time.Since(t0))
	// The floor in the same run, so that the ratio the target is
	// set in comes from one machine state.
	floor, err := b.probeFloor(ctx, names)
	if err != nil {
		return err
	}
	// The same raw probes one every 10 ms, as noderun makes them: what
	// the system calls cost from a thread woken for each.
	paced, err := b.rawProbes(ctx, names, 500, time.Second/time.Duration(cfg.ProbePods))
	if err != nil {
		return err
	}
	fmt.Printf("%d pods probed every second: noderun used %.2f %% of a core while profiled; the raw-syscall floor %.2f %% (%.2fx), paced as noderun's %.2f %% (%.2fx)\nprofiles: %s %s\n",
		cfg.ProbePods, cpu, floor, cpu/floor, paced, cpu/paced, cpuPath, heapPath)
	b.nw.drain()
	if _, err := b.node.removeManifests(names); err != nil {
		return err
	}
	return b.node.waitNoPods(ctx, waitTimeout)
}
