package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/noderun/noderun/internal/testnode"
)

// The four systems of `make bench-peers`, in the table's order.
const (
	sysNoderun = "noderun"
	sysFloor   = "floor"
	sysKubelet = "kubelet"
	sysPodman  = "podman"
)

var allSystems = []string{sysNoderun, sysFloor, sysKubelet, sysPodman}

// PeersConfig says how much the peers bench measures.
type PeersConfig struct {
	Runs         int   // one-pod repetitions per system
	BurstRuns    int   // repetitions of each burst per system
	BigBurstRuns int   // the same for bursts of 100 pods or more
	Bursts       []int // burst sizes
	PSSPods      []int // burst sizes at which the whole-node PSS is taken
	InitRuns     int   // repetitions of the pod with init containers
	CrashRuns    int   // repetitions of the crashed container's restart
	RebootRuns   int   // repetitions of the reboot recovery
	RebootPods   int
	ProbePods    int           // pods with httpGet probes for the probe CPU (0: none)
	CPUWindow    time.Duration // probe and idle CPU window
	// Systems measured, in allSystems' order; noderun always.
	Systems []string
	// The kubelet's and podman's networks: bridges and subnets of their own.
	KubeSubnet, PodmanSubnet string
}

// peers is everything the peers bench runs beside noderun and the floor.
type peers struct {
	*bench
	pc       PeersConfig
	kube     *kubelet
	podman   *podman
	samples  map[string]map[string][]float64 // measure -> system -> samples
	failures []string
	na       map[string]map[string]string // measure -> system -> why not measured
}

// runPeers measures the four systems in one run and returns the table.
func runPeers(ctx context.Context, cfg Config, pc PeersConfig) (table string, retErr error) {
	b, teardown, err := setup(ctx, cfg)
	if err != nil {
		return "", err
	}
	defer func() { retErr = errors.Join(retErr, teardown()) }()
	p := &peers{bench: b, pc: pc, samples: map[string]map[string][]float64{}, na: map[string]map[string]string{}}
	kubeBridge, podmanBridge := cfg.Bridge[:min(len(cfg.Bridge), 14)]+"k", cfg.Bridge[:min(len(cfg.Bridge), 14)]+"p"
	for _, n := range [][2]string{{kubeBridge, pc.KubeSubnet}, {podmanBridge, pc.PodmanSubnet}} {
		release, ok, err := testnode.ClaimNetwork(n[0])
		if err != nil || !ok {
			return "", errors.Join(err, fmt.Errorf("bridge %s: another run on this machine uses it", n[0]))
		}
		defer release()
		if err := testnode.NetworkFree(n[0], n[1]); err != nil {
			return "", err
		}
	}
	if slices.Contains(pc.Systems, sysKubelet) {
		b.logf("starting the kubelet %s (built from its module, cached) and its containerd", kubeVersion)
		if p.kube, err = startKubelet(ctx, b.env, kubeBridge, pc.KubeSubnet); err != nil {
			return "", err
		}
		defer func() { retErr = errors.Join(retErr, p.kube.close(), deleteLink(kubeBridge)) }()
	}
	if slices.Contains(pc.Systems, sysPodman) {
		if p.podman, err = startPodman(ctx, b.env, pc.PodmanSubnet); err != nil {
			return "", err
		}
		defer func() { retErr = errors.Join(retErr, p.podman.close()) }()
	}
	load := loadAvg()
	t0 := time.Now()
	if err := p.measure(ctx); err != nil {
		return "", err
	}
	m := machineInfo(ctx, b.env.client)
	return p.table(m, load, loadAvg(), time.Since(t0)), nil
}

// measure runs every scenario, each repetition running the four systems
// back to back in an order rotated per repetition, so drift and the
// machine's other load hit all alike.
func (p *peers) measure(ctx context.Context) error {
	p.logf("warm-up")
	systems := p.pc.Systems
	for _, s := range systems {
		if _, _, err := p.pods(ctx, s, "w", 1, false); err != nil {
			return fmt.Errorf("%s warm-up: %w", s, err)
		}
	}
	type scenario struct {
		n, runs int
	}
	scs := []scenario{{1, p.pc.Runs}}
	for _, n := range p.pc.Bursts {
		scs = append(scs, scenario{n, map[bool]int{false: p.pc.BurstRuns, true: p.pc.BigBurstRuns}[n >= 100]})
	}
	for i, sc := range scs {
		for r := range sc.runs {
			for i := range systems {
				s := systems[(i+r)%len(systems)]
				p.logf("%d pod(s), run %d/%d: %s", sc.n, r+1, sc.runs, s)
				start, down, err := p.pods(ctx, s, fmt.Sprintf("%c%dr%d", s[0], sc.n, r), sc.n, r == sc.runs-1)
				if err != nil {
					return fmt.Errorf("%s, %d pods: %w", s, sc.n, err)
				}
				p.add(startMeasure(sc.n), s, start.Seconds())
				if sc.n > 1 {
					p.add(fmt.Sprintf("removal of %d pods, s", sc.n), s, down.Seconds())
				}
			}
		}
		if i == 0 { // the init pod after the one-pod runs
			p.rotate(ctx, p.pc.InitRuns, "pod with init containers", p.initPodRun)
		}
	}
	p.rotate(ctx, p.pc.CrashRuns, "crashed container", p.crashRun)
	for _, s := range []string{sysPodman} {
		p.notMeasured(fmt.Sprintf(measureReboot, p.pc.RebootPods), s, "no agent: after a boot, podman-restart.service (podman start --all --filter restart-policy=always) brings them back; not simulated")
	}
	p.rotate(ctx, p.pc.RebootRuns, fmt.Sprintf("reboot recovery of %d pods", p.pc.RebootPods), func(ctx context.Context, s string, r int) error {
		if s == sysPodman {
			return nil
		}
		return p.rebootRun(ctx, s, r)
	})
	if p.pc.ProbePods > 0 {
		for _, part := range []string{"agent", "whole stack"} {
			p.notMeasured(fmt.Sprintf(measureProbe, p.pc.ProbePods, part), sysPodman, "podman 4.3 kube play runs no readinessProbe (a livenessProbe becomes a healthcheck, run by systemd timers)")
		}
		p.rotate(ctx, 1, fmt.Sprintf("%d pods with httpGet probes", p.pc.ProbePods), func(ctx context.Context, s string, _ int) error {
			if s == sysFloor || s == sysPodman { // the floor's figure comes with noderun's
				return nil
			}
			return p.probeRun(ctx, s)
		})
	}
	return nil
}

// rotate runs scenario runs times on every system, the order rotated per
// repetition. A failure is recorded in the table (the scenarios after it
// still run), not fatal.
func (p *peers) rotate(ctx context.Context, runs int, what string, scenario func(ctx context.Context, s string, r int) error) {
	systems := p.pc.Systems
	for r := range runs {
		for i := range systems {
			s := systems[(i+r)%len(systems)]
			p.logf("%s, run %d/%d: %s", what, r+1, runs, s)
			if err := scenario(ctx, s, r); err != nil {
				p.logf("%s on %s failed: %v", what, s, err)
				p.failures = append(p.failures, fmt.Sprintf("%s on %s, run %d: %v", what, s, r+1, err))
			}
		}
	}
}

func startMeasure(n int) string {
	if n == 1 {
		return "one pod: manifest → Ready in its own API, s"
	}
	return fmt.Sprintf("burst of %d: manifests → all Ready, s", n)
}

func (p *peers) add(measure, system string, v float64) {
	if p.samples[measure] == nil {
		p.samples[measure] = map[string][]float64{}
	}
	p.samples[measure][system] = append(p.samples[measure][system], v)
}

// pods starts n pods on system s, and removes them again: start runs
// from the manifest's appearance until the system's own API reports all
// Ready (the floor: containerd reports every process started), down until
// nothing of them is left. At PSSPods pods, the whole node's PSS is
// sampled while they run, and on the last run of the largest burst the
// idle CPU.
func (p *peers) pods(ctx context.Context, s, prefix string, n int, last bool) (start, down time.Duration, err error) {
	names := podNames(prefix, n)
	whileUp := func() error {
		if last && n == slices.Max(p.pc.Bursts) {
			if err := p.stackCPU(ctx, s, func(part string) string { return fmt.Sprintf(measureIdleCPU, n, part) }); err != nil {
				return err
			}
		}
		if !slices.Contains(p.pc.PSSPods, n) {
			return nil
		}
		parts, err := p.stackPSS(s)
		if err != nil {
			return err
		}
		var sum float64
		for k, v := range parts {
			p.add(fmt.Sprintf("whole-node PSS at %d pods: %s, MiB", n, k), s, v)
			sum += v
		}
		p.add(fmt.Sprintf("whole-node PSS at %d pods, MiB", n), s, sum)
		return nil
	}
	switch s {
	case sysNoderun:
		var api time.Duration
		_, down, err = p.nodePods(ctx, prefix, n, &api, nil, func([]string) error { return whileUp() })
		return api, down, err
	case sysFloor:
		return p.floorPods(ctx, prefix, n, nil, whileUp)
	case sysKubelet:
		if err := sleep(ctx, settle); err != nil {
			return 0, 0, err
		}
		t0, err := p.kube.writePods(names, nil)
		if err != nil {
			return 0, 0, err
		}
		at, err := p.kube.waitPods(ctx, names, true)
		if err != nil {
			return 0, 0, err
		}
		if err := errors.Join(sleep(ctx, settle), whileUp()); err != nil {
			return 0, 0, err
		}
		down, err = p.kube.removePods(ctx, names)
		return at.Sub(t0), down, err
	default:
		if err := sleep(ctx, settle); err != nil {
			return 0, 0, err
		}
		path, err := p.podman.writePods(names, nil)
		if err != nil {
			return 0, 0, err
		}
		if start, err = p.podman.play(ctx, path, n); err != nil {
			return 0, 0, errors.Join(err, p.podman.close())
		}
		if err := errors.Join(sleep(ctx, settle), whileUp()); err != nil {
			return 0, 0, err
		}
		down, err = p.podman.down(ctx, path)
		return start, down, err
	}
}

// stackPSS is the PSS (MiB) of every process system s needs to run its
// pods, besides the containers' own (stackProcs), by part.
func (p *peers) stackPSS(s string) (map[string]float64, error) {
	if s == sysNoderun {
		n, err := p.measurePSS()
		return map[string]float64{partAgent: n.noderun, partLogging: n.logging, partContainerd: n.containerd, partShims: n.shims}, err
	}
	parts, err := p.stackProcs(s)
	out := map[string]float64{}
	for part, pids := range parts {
		for _, pid := range pids {
			if kib, err := pssKiB(pid); err == nil { // else ended meanwhile
				out[part] += float64(kib) / 1024
			}
		}
	}
	return out, err
}

// stackProcs finds every process system s needs to run its pods, besides
// the containers' own, by part: the agent, its log processes,
// containerd or podman's conmons, the shims, the pause (infra)
// processes. The floor has no agent; its containerd is the one noderun
// uses too, its shims those of its namespace.
func (p *peers) stackProcs(s string) (map[string][]int, error) {
	if s == sysNoderun {
		parts, err := p.nodeProcs()
		delete(parts, partDrivers) // within partLogging
		return parts, err
	}
	procs, err := testnode.Processes()
	if err != nil {
		return nil, err
	}
	shims := map[int]bool{}
	classify := func(pr testnode.Proc) string {
		base := ""
		if len(pr.Args) > 0 {
			base = filepath.Base(pr.Args[0])
		}
		switch {
		case s == sysFloor && pr.PID == p.env.daemon.PID():
			return partContainerd
		case s == sysFloor && isShim(pr.Args, p.env.daemon.Address(), floorNS):
			shims[pr.PID] = true
			return partShims
		case s == sysKubelet && pr.PID == p.kube.proc.Process.Pid:
			return partAgent
		case s == sysKubelet && pr.PID == p.kube.ctrd.Process.Pid:
			return partContainerd
		case s == sysKubelet && isShim(pr.Args, p.kube.socket, ""):
			shims[pr.PID] = true
			return partShims
		case s == sysPodman && base == "conmon" && slices.ContainsFunc(pr.Args, func(a string) bool { return strings.HasPrefix(a, p.podman.dir) }):
			shims[pr.PID] = true
			return "conmon"
		}
		return ""
	}
	out := map[string][]int{}
	var rest []testnode.Proc
	for _, pr := range procs {
		if k := classify(pr); k != "" {
			out[k] = append(out[k], pr.PID)
		} else {
			rest = append(rest, pr)
		}
	}
	// The pause (infra) processes: a shim's or conmon's children running
	// the sandbox image's program.
	for _, pr := range rest {
		if shims[ppid(pr.PID)] && len(pr.Args) > 0 && (slices.Equal(pr.Args, []string{"sleep", "infinity"}) || filepath.Base(pr.Args[0]) == "catatonit") {
			out["pause"] = append(out["pause"], pr.PID)
		}
	}
	return out, nil
}

// ppid is a process's parent, 0 if it is gone.
func ppid(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command may hold spaces and parentheses: fields follow the last ')'.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 2 {
		return 0
	}
	n, _ := strconv.Atoi(f[1])
	return n
}

// deleteLink removes a bridge the kubelet's or podman's network left.
func deleteLink(name string) error {
	if _, err := os.Stat("/sys/class/net/" + name); err != nil {
		return nil
	}
	if out, err := exec.Command("ip", "link", "del", name).CombinedOutput(); err != nil {
		return fmt.Errorf("ip link del %s: %w: %s", name, err, out)
	}
	return nil
}

// peerTargets are issue 40's: noderun's median over the other system's,
// at most, for the rows starting with the key.
var peerTargets = map[string][]struct {
	peer string
	max  float64
}{
	"one pod":                {{sysKubelet, 0.35}, {sysPodman, 0.5}},
	"burst of 30":            {{sysKubelet, 0.25}},
	"burst of 100":           {{sysKubelet, 0.25}},
	"whole-node PSS at 30 p": {{sysKubelet, 0.5}},
	"reboot recovery":        {{sysKubelet, 0.3}, {sysFloor, 1.0}},
	"probe CPU, 100 pods with an httpGet readiness probe every 1 s: agent": {{sysKubelet, 0.5}, {sysFloor, 2}},
}

// table is the Markdown table: each system's median (min–max), noderun's
// median over each other system's, and issue 40's targets; then why a
// system has no figure somewhere, and what failed.
func (p *peers) table(m Machine, loadBefore, loadAfter string, took time.Duration) string {
	systems := allSystems
	var w strings.Builder
	fmt.Fprintf(&w, "Run %s on %d CPUs, %d MiB, kernel %s, containerd %s, %s, kubelet %s, podman %s; load average before: %s, after: %s; measuring took %s.\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), m.CPUs, m.MemoryMiB, m.Kernel, m.Containerd, m.Runc, kubeVersion, podmanVersion(), loadBefore, loadAfter, took.Round(time.Second))
	fmt.Fprintf(&w, "| measure | %s | noderun ÷ floor | ÷ kubelet | ÷ podman | target | result |\n", strings.Join(systems, " | "))
	fmt.Fprintf(&w, "| --- |%s --- | --- | --- | --- | --- |\n", strings.Repeat(" --- |", len(systems)))
	measures := make([]string, 0, len(p.samples))
	for k := range p.samples {
		measures = append(measures, k)
	}
	slices.SortFunc(measures, func(a, b string) int {
		if d := measureOrder(a) - measureOrder(b); d != 0 {
			return d
		}
		return strings.Compare(a, b)
	})
	var notes []string
	for _, k := range measures {
		unit := k[strings.LastIndex(k, ", ")+2:]
		st := map[string]*Stats{}
		fmt.Fprintf(&w, "| %s |", strings.TrimSuffix(k, ", "+unit))
		for _, s := range systems {
			st[s] = statsOf(p.samples[k][s])
			cell := formatStats(st[s], unit)
			if why, ok := p.na[k][s]; ok && cell == "" {
				if i := slices.Index(notes, why); i >= 0 {
					cell = fmt.Sprintf("n/a (%d)", i+1)
				} else {
					notes = append(notes, why)
					cell = fmt.Sprintf("n/a (%d)", len(notes))
				}
			}
			fmt.Fprintf(&w, " %s |", cell)
		}
		ratio := func(peer string) float64 {
			if st[sysNoderun] == nil || st[peer] == nil || st[peer].Median == 0 {
				return 0
			}
			return st[sysNoderun].Median / st[peer].Median
		}
		for _, peer := range systems[1:] { // in the header's order
			if r := ratio(peer); r > 0 {
				fmt.Fprintf(&w, " %.2f× |", r)
			} else {
				fmt.Fprint(&w, " |")
			}
		}
		targets, results := targetsOf(k, ratio)
		fmt.Fprintf(&w, " %s | %s |\n", strings.Join(targets, ", "), strings.Join(results, ", "))
	}
	for i, n := range notes {
		fmt.Fprintf(&w, "\n(%d) %s", i+1, n)
	}
	for _, f := range p.failures {
		fmt.Fprintf(&w, "\nFAILED: %s", f)
	}
	if len(notes)+len(p.failures) > 0 {
		fmt.Fprintln(&w)
	}
	return w.String()
}

// targetsOf is row k's targets and whether noderun met them.
func targetsOf(k string, ratio func(peer string) float64) (targets, results []string) {
	for _, prefix := range slices.Sorted(maps.Keys(peerTargets)) {
		ts := peerTargets[prefix]
		if !strings.HasPrefix(k, prefix) || strings.HasPrefix(k, "whole-node PSS") && strings.Contains(k, ": ") {
			continue
		}
		for _, t := range ts {
			targets = append(targets, fmt.Sprintf("≤ %g× %s", t.max, t.peer))
			switch r := ratio(t.peer); {
			case r == 0:
				results = append(results, "not measured")
			case r <= t.max:
				results = append(results, "pass")
			default:
				results = append(results, "FAIL")
			}
		}
	}
	return targets, results
}

// measureOrder puts the table's rows in the scenarios' order.
func measureOrder(k string) int {
	for i, prefix := range []string{"one pod", "pod with", "burst of", "removal", "restart of", "reboot", "probe CPU", "idle CPU", "whole-node PSS at"} {
		if strings.HasPrefix(k, prefix) {
			n := 0 // the row's first number: its pod count
			for _, f := range strings.Fields(strings.TrimPrefix(k, prefix)) {
				if v, err := strconv.Atoi(strings.TrimSuffix(f, ":")); err == nil {
					n = v
					break
				}
			}
			sub := 0
			if strings.Contains(k, ": ") && prefix == "whole-node PSS at" {
				sub = 1
			}
			return i*100000 + n*10 + sub
		}
	}
	return 1 << 30
}

func podmanVersion() string {
	out, err := exec.Command("podman", "--version").Output()
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(out))
	return f[len(f)-1]
}
