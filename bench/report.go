package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/containerd"
	"golang.org/x/sys/unix"
)

// Report is what one run found: the table and the JSON hold the same rows.
type Report struct {
	Time    time.Time `json:"time"`
	Machine Machine   `json:"machine"`
	Config  Config    `json:"config"`
	Rows    []Row     `json:"results"`

	// For the smoke test's cleanup checks.
	dir           string
	containerdPID int
}

// Machine describes where the figures came from. HostBusy is how busy all
// CPUs were during the steady-state window, when the bench itself is idle:
// what other work on the machine was doing meanwhile.
type Machine struct {
	CPUs       int     `json:"cpus"`
	MemoryMiB  int     `json:"memory_mib"`
	Kernel     string  `json:"kernel"`
	Containerd string  `json:"containerd"`
	Runc       string  `json:"runc"`
	Go         string  `json:"go"`
	LoadBefore string  `json:"load_before"` // /proc/loadavg at the start
	HostBusy   float64 `json:"host_busy_percent_in_cpu_window"`
}

// Stats summarizes repeated samples.
type Stats struct {
	Median  float64   `json:"median"`
	Min     float64   `json:"min"`
	Max     float64   `json:"max"`
	Samples []float64 `json:"samples"`
}

func statsOf(xs []float64) *Stats {
	if len(xs) == 0 {
		return nil
	}
	s := slices.Sorted(slices.Values(xs))
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return &Stats{Median: med, Min: s[0], Max: s[len(s)-1], Samples: xs}
}

// Row is one line of the table. Ratio is noderun's median over the floor's.
type Row struct {
	Key     string  `json:"key"`
	Measure string  `json:"measure"`
	Unit    string  `json:"unit"`
	Noderun *Stats  `json:"noderun,omitempty"`
	Floor   *Stats  `json:"floor,omitempty"`
	Ratio   float64 `json:"ratio_to_floor,omitempty"`
	Kubelet string  `json:"kubelet_reference,omitempty"`
	Target  string  `json:"target,omitempty"`
	Pass    *bool   `json:"pass,omitempty"`

	target *target
}

// target is a goal from issues 5 and 14.
type target struct {
	text string
	ok   func(Row) bool
}

func ratioAtMost(x float64) *target {
	return &target{fmt.Sprintf("≤ %g× floor", x), func(r Row) bool { return r.Ratio > 0 && r.Ratio <= x }}
}

func atMost(x float64, unit string) *target {
	return &target{"≤ " + format(x, unit), func(r Row) bool { return r.Noderun != nil && r.Noderun.Median <= x }}
}

func (r Row) finish() Row {
	if r.Noderun != nil && r.Floor != nil && r.Floor.Median > 0 {
		r.Ratio = r.Noderun.Median / r.Floor.Median
	}
	if r.target != nil {
		pass := r.target.ok(r)
		r.Target, r.Pass = r.target.text, &pass
	}
	return r
}

// onlyAt returns t when n is the pod count the issue sets it for.
func onlyAt(n, want int, t *target) *target {
	if n == want {
		return t
	}
	return nil
}

func (m *measurements) rows(cfg Config) []Row {
	var rows []Row
	add := func(r Row) { rows = append(rows, r.finish()) }
	add(Row{Key: "one_pod_start", Measure: "1 pod: manifest → process running (containerd)", Unit: "s",
		Noderun: statsOf(m.onePod.noderun), Floor: statsOf(m.onePod.floor),
		Kubelet: "0.16 s (floor 0.10 s)", target: ratioAtMost(0.75)})
	add(Row{Key: "one_pod_api_running", Measure: "1 pod: manifest → Running in status API", Unit: "s",
		Noderun: statsOf(m.onePodAPI), Floor: statsOf(m.onePod.floor), Kubelet: "0.9 s", target: ratioAtMost(0.8)})
	add(Row{Key: "one_pod_teardown", Measure: "1 pod: manifest removed → nothing left", Unit: "s",
		Noderun: statsOf(m.onePodTeardown.noderun), Floor: statsOf(m.onePodTeardown.floor)})
	if cfg.InitRuns > 0 {
		add(Row{Key: "init_pod_start", Measure: fmt.Sprintf("1 pod, %d init + %d app containers: manifest → all started", initCount, appCount), Unit: "s",
			Noderun: statsOf(m.initPod.noderun), Floor: statsOf(m.initPod.floor), target: ratioAtMost(1.0)})
		add(Row{Key: "init_pod_teardown", Measure: fmt.Sprintf("1 pod, %d init + %d app containers: removed → nothing left", initCount, appCount), Unit: "s",
			Noderun: statsOf(m.initPodTeardown.noderun), Floor: statsOf(m.initPodTeardown.floor)})
	}
	for _, n := range cfg.Bursts {
		r := Row{Key: fmt.Sprintf("burst_%d_start", n), Measure: fmt.Sprintf("%d pods at once → all running", n), Unit: "s",
			Noderun: statsOf(m.burst[n].noderun), Floor: statsOf(m.burst[n].floor)}
		if n == 30 || n == 100 {
			r.target = ratioAtMost(0.9)
		}
		if n == 30 {
			r.Kubelet = "6.2 s (floor 1.3 s)"
		}
		add(r)
	}
	for _, n := range cfg.Bursts {
		add(Row{Key: fmt.Sprintf("burst_%d_cpu", n), Measure: fmt.Sprintf("%d pods at once: the machine's CPU per pod until all run", n), Unit: "ms",
			Noderun: statsOf(m.burstCPU[n].noderun), Floor: statsOf(m.burstCPU[n].floor)})
	}
	for _, n := range cfg.Bursts {
		add(Row{Key: fmt.Sprintf("burst_%d_teardown", n), Measure: fmt.Sprintf("%d pods removed → nothing left", n), Unit: "s",
			Noderun: statsOf(m.teardown[n].noderun), Floor: statsOf(m.teardown[n].floor), target: onlyAt(n, 30, ratioAtMost(1.0))})
	}
	rows = append(rows, m.costRows(cfg)...)
	for _, n := range append([]int{0}, cfg.Bursts...) {
		r := Row{Key: fmt.Sprintf("rss_%d_pods", n), Measure: fmt.Sprintf("RSS, idle, %d pods", n), Unit: "MiB", Noderun: statsOf(m.rss[n])}
		switch n {
		case 0:
			r.Kubelet = "77 MiB"
		case 30:
			r.Kubelet, r.target = "88 MiB", atMost(25, "MiB")
		case 100:
			r.target = atMost(40, "MiB")
		}
		add(r)
	}
	for _, n := range append([]int{0}, cfg.Bursts...) {
		add(Row{Key: fmt.Sprintf("rss_anon_%d_pods", n), Measure: fmt.Sprintf("RSS anonymous (not the binary's pages), %d pods", n), Unit: "MiB", Noderun: statsOf(m.anon[n])})
	}
	rows = append(rows, m.pssRows(cfg)...)
	rows = append(rows, m.shims.rows()...)
	rows = append(rows, m.logThroughputRows()...)
	for _, n := range append([]int{0}, cfg.Bursts...) {
		add(Row{Key: fmt.Sprintf("heap_%d_pods", n), Measure: fmt.Sprintf("Go heap after GC, %d pods", n), Unit: "MiB", Noderun: statsOf(m.heap[n])})
	}
	add(Row{Key: "idle_cpu", Measure: fmt.Sprintf("CPU, %d pods, %s steady state", m.cpuPods, cfg.CPUWindow), Unit: "% of a core",
		Noderun: statsOf([]float64{m.cpuPercent}), Kubelet: "1.6 % (30 pods)", target: onlyAt(m.cpuPods, 100, atMost(0.2, "% of a core"))})
	if m.probePods > 0 {
		add(Row{Key: "probe_http_cpu", Measure: fmt.Sprintf("CPU, %d pods with an httpGet readinessProbe every 1 s", m.probePods), Unit: "% of a core",
			Noderun: statsOf([]float64{m.probeHTTPCPU}), target: onlyAt(m.probePods, 100, atMost(0.5, "% of a core"))})
		add(Row{Key: "probe_http_floor_cpu", Measure: fmt.Sprintf("least CPU for the same %d probes a second: fresh TCP connection + GET in raw system calls, one thread", m.probePods), Unit: "% of a core",
			Noderun: statsOf([]float64{m.probeFloorCPU})})
		add(Row{Key: "probe_http_host_cpu", Measure: fmt.Sprintf("host CPU busy, same %d httpGet-probed pods", m.probePods), Unit: "% of a core",
			Noderun: statsOf([]float64{m.probeHTTPHost})})
		add(Row{Key: "probe_exec_cpu", Measure: fmt.Sprintf("CPU, %d pods with an exec livenessProbe every 10 s", m.probePods), Unit: "% of a core",
			Noderun: statsOf([]float64{m.probeExecCPU})})
		add(Row{Key: "probe_exec_host_cpu", Measure: fmt.Sprintf("host CPU busy (containerd, shims, runc exec), same %d exec-probed pods", m.probePods), Unit: "% of a core",
			Noderun: statsOf([]float64{m.probeExecHost})})
	}
	if cfg.ImageTarballs > 0 {
		what := fmt.Sprintf("%d images of %d MiB in the images dir", cfg.ImageTarballs, cfg.ImageTarballMiB)
		add(Row{Key: "start_images_first", Measure: "start to healthy, " + what + ", first start (imports follow)", Unit: "s",
			Noderun: statsOf([]float64{m.imagesFirstStart})})
		add(Row{Key: "start_images_imported", Measure: "start to every image imported, " + what + ", first start", Unit: "s",
			Noderun: statsOf([]float64{m.imagesImported})})
		add(Row{Key: "start_images_second", Measure: "start to healthy, the same, second start (ledger: nothing read)", Unit: "s",
			Noderun: statsOf([]float64{m.imagesSecondStart})})
	}
	add(Row{Key: "api_get_pods", Measure: fmt.Sprintf("GET /pods latency, %d pods", m.apiGetPods), Unit: "ms", Noderun: statsOf(m.apiGetMS)})
	add(Row{Key: "binary_size", Measure: "binary size, stripped", Unit: "MiB", Noderun: statsOf([]float64{m.binaryMiB})})
	return rows
}

// costRows are the per-pod start cost (a burst's time over its pods) at each
// burst size, and how it grows from the smallest burst to the largest.
func (m *measurements) costRows(cfg Config) []Row {
	perPod := func(xs []float64, n int) []float64 {
		out := make([]float64, len(xs))
		for i, x := range xs {
			out[i] = 1000 * x / float64(n)
		}
		return out
	}
	var rows []Row
	for _, n := range cfg.Bursts {
		rows = append(rows, Row{Key: fmt.Sprintf("per_pod_cost_%d", n), Measure: fmt.Sprintf("start cost per pod, %d pods", n), Unit: "ms",
			Noderun: statsOf(perPod(m.burst[n].noderun, n)), Floor: statsOf(perPod(m.burst[n].floor, n))}.finish())
	}
	small, large := slices.Min(cfg.Bursts), slices.Max(cfg.Bursts)
	// Per pod, the medians' quotient equals the bursts' scaled by the sizes.
	growth := func(big, little []float64) *Stats {
		return statsOf([]float64{statsOf(big).Median / statsOf(little).Median * float64(small) / float64(large)})
	}
	r := Row{Key: "per_pod_cost_growth", Measure: fmt.Sprintf("per-pod cost, %d pods ÷ %d pods", large, small), Unit: "×",
		Noderun: growth(m.burst[large].noderun, m.burst[small].noderun),
		Floor:   growth(m.burst[large].floor, m.burst[small].floor)}
	if small == 10 && large == 100 {
		r.target = atMost(1.2, "×")
	}
	r = r.finish()
	r.Ratio = 0 // a ratio of ratios says nothing
	return append(rows, r)
}

func format(v float64, unit string) string {
	switch unit {
	case "s":
		return fmt.Sprintf("%.3f s", v)
	case "ms":
		return fmt.Sprintf("%.1f ms", v)
	case "MiB":
		return fmt.Sprintf("%.1f MiB", v)
	case "KiB":
		return fmt.Sprintf("%.0f KiB", v)
	case "MB/s":
		return fmt.Sprintf("%.1f MB/s", v)
	case "×":
		return fmt.Sprintf("%.2f×", v)
	case "% of a core":
		return fmt.Sprintf("%.3f %%", v)
	}
	return fmt.Sprintf("%g %s", v, unit)
}

func formatStats(s *Stats, unit string) string {
	if s == nil {
		return ""
	}
	out := format(s.Median, unit)
	if len(s.Samples) > 1 {
		// Without the unit twice, e.g. "0.213 s (0.201–0.250)".
		lo, hi := format(s.Min, unit), format(s.Max, unit)
		out += fmt.Sprintf(" (%s–%s)", strings.Fields(lo)[0], strings.Fields(hi)[0])
	}
	return out
}

// writeTable prints the rows as a Markdown table, readable in a terminal
// and ready for docs/performance.md.
func (rep *Report) writeTable(w io.Writer) {
	fmt.Fprintln(w, "| measure | noderun median (min–max) | floor median (min–max) | noderun ÷ floor | kubelet (issue 5) | target | result |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- |")
	for _, r := range rep.Rows {
		ratio, result := "", ""
		if r.Ratio > 0 {
			ratio = fmt.Sprintf("%.2f×", r.Ratio)
		}
		if r.Pass != nil {
			result = map[bool]string{true: "pass", false: "**FAIL**"}[*r.Pass]
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s |\n", r.Measure,
			formatStats(r.Noderun, r.Unit), formatStats(r.Floor, r.Unit), ratio, r.Kubelet, r.Target, result)
	}
	m := rep.Machine
	runState := "a tmpfs, as /run on a host"
	if rep.Config.RunStateOnDisk {
		runState = "disk (-run-state-on-disk)"
	}
	state := "a journaled ext4 of the bench's own"
	if rep.Config.StateOnHostFS {
		state = "/tmp's filesystem (-state-on-host-fs)"
	}
	fmt.Fprintf(w, "\n%d CPUs, %d MiB, Linux %s, containerd %s, %s, %s; load average %s at the start; "+
		"all CPUs %.1f %% busy during the steady-state window; run-time state on %s, persistent state on %s.\n",
		m.CPUs, m.MemoryMiB, m.Kernel, m.Containerd, m.Runc, m.Go, m.LoadBefore, m.HostBusy, runState, state)
}

func (rep *Report) writeJSON(path string) error {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

// userHZ is the unit of /proc/stat times; the kernel fixes it at 100 for
// user space.
const userHZ = 100

// hostBusy returns the busy time of all CPUs so far (hostCPU's).
func hostBusy() (time.Duration, error) {
	busy, _, err := hostCPU()
	return time.Duration(busy) * time.Second / userHZ, err
}

// busySince sets *cpu, if cpu is set, to the machine's busy time since
// hostBusy gave busy0.
func busySince(busy0 time.Duration, cpu *time.Duration) error {
	if cpu == nil {
		return nil
	}
	busy1, err := hostBusy()
	*cpu = busy1 - busy0
	return err
}

// hostCPU returns the busy and total time of all CPUs so far, in ticks,
// from /proc/stat; idle and iowait count as not busy.
func hostCPU() (busy, total uint64, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	fields := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	if len(fields) < 9 || fields[0] != "cpu" {
		return 0, 0, fmt.Errorf("/proc/stat: unexpected %q", line)
	}
	for i, f := range fields[1:9] {
		v, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return 0, 0, err
		}
		total += v
		if i != 3 && i != 4 {
			busy += v
		}
	}
	return busy, total, nil
}

func machineInfo(ctx context.Context, client *containerd.Client) Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version()}
	var uts unix.Utsname
	if unix.Uname(&uts) == nil {
		m.Kernel = unix.ByteSliceToString(uts.Release[:])
	}
	if f, err := os.Open("/proc/meminfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
				kb, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
				m.MemoryMiB = kb / 1024
			}
		}
		f.Close()
	}
	if v, err := client.Version(ctx); err == nil {
		m.Containerd = v.Version
	}
	if out, err := exec.Command("runc", "--version").Output(); err == nil {
		m.Runc, _, _ = strings.Cut(string(out), "\n")
	}
	return m
}

// pssRows are the whole node's memory (issue 12): the PSS of noderun, of
// its log drivers, of containerd and of the shims, their sum, and the
// logging cost per container.
func (m *measurements) pssRows(cfg Config) []Row {
	var rows []Row
	part := func(samples []nodePSS, f func(nodePSS) float64) *Stats {
		var v []float64
		for _, s := range samples {
			v = append(v, f(s))
		}
		return statsOf(v)
	}
	for _, n := range append([]int{0}, cfg.Bursts...) {
		samples := m.pss[n]
		for _, p := range []struct {
			key, what string
			f         func(nodePSS) float64
			target    *target
		}{
			{"noderun", "noderun", func(p nodePSS) float64 { return p.noderun }, nil},
			{"logging", "its log collector (and log drivers)", func(p nodePSS) float64 { return p.logging }, nil},
			{"containerd", "containerd", func(p nodePSS) float64 { return p.containerd }, nil},
			{"shims", "the shims", func(p nodePSS) float64 { return p.shims }, nil},
			{"noderun_logging", "noderun and its logging", func(p nodePSS) float64 { return p.noderun + p.logging },
				map[int]*target{30: atMost(25, "MiB"), 100: atMost(40, "MiB")}[n]},
			{"node", "whole node (all four)", nodePSS.sum, nil},
		} {
			if n == 0 && p.key == "shims" {
				continue // none without pods
			}
			rows = append(rows, Row{Key: fmt.Sprintf("pss_%s_%d_pods", p.key, n), Measure: fmt.Sprintf("PSS, %s, %d pods", p.what, n),
				Unit: "MiB", Noderun: part(samples, p.f), target: p.target}.finish())
		}
		if idle := part(m.pss[0], func(p nodePSS) float64 { return p.logging }); n > 0 && idle != nil {
			// Marginal: what the pods added to the collector running at 0 pods.
			rows = append(rows, Row{Key: fmt.Sprintf("pss_logging_per_container_%d_pods", n), Measure: fmt.Sprintf("PSS of logging per added container, %d pods", n),
				Unit: "KiB", Noderun: part(samples, func(p nodePSS) float64 { return (p.logging - idle.Median) * 1024 / float64(n) }), target: atMost(0.3*1024, "KiB")}.finish())
		}
	}
	// The cost of one more container: the growth of the whole node from
	// the smallest burst to the largest, per pod.
	if bs := cfg.Bursts; len(bs) > 1 {
		lo, hi := statsOf(sums(m.pss[bs[0]])), statsOf(sums(m.pss[bs[len(bs)-1]]))
		if lo != nil && hi != nil {
			per := (hi.Median - lo.Median) / float64(bs[len(bs)-1]-bs[0])
			rows = append(rows, Row{Key: "pss_node_per_pod", Measure: fmt.Sprintf("PSS of the whole node per added pod, %d → %d pods", bs[0], bs[len(bs)-1]),
				Unit: "MiB", Noderun: statsOf([]float64{per})}.finish())
		}
	}
	return rows
}

func sums(samples []nodePSS) []float64 {
	var out []float64
	for _, s := range samples {
		out = append(out, s.sum())
	}
	return out
}
