package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

const (
	// settle is the quiet time before each start and teardown, so that
	// containerd's background work (snapshot GC, shim exits) after one phase
	// does not land in the next.
	settle      = 2 * time.Second
	waitTimeout = 3 * time.Minute
)

// pair holds one measure's samples, in seconds, for noderun and the floor.
type pair struct{ noderun, floor []float64 }

// measurements is every sample taken; report.go turns them into rows.
type measurements struct {
	onePod          pair // manifest rename (floor: first step) -> process runs
	onePodAPI       []float64
	onePodTeardown  pair
	initPod         pair // 3 init + 2 app containers: manifest -> all started
	initPodTeardown pair
	burst           map[int]*pair     // by pod count: start of all
	burstCPU        map[int]*pair     // by pod count: the machine's CPU per pod over that start, ms
	teardown        map[int]*pair     // by pod count: nothing left
	rss, anon, heap map[int][]float64 // by pod count, MiB
	pss             map[int][]nodePSS // whole node, by pod count
	cpuPercent      float64
	cpuPods         int
	hostBusyPercent float64 // all CPUs, same window
	apiGetMS        []float64
	// Probes: noderun's CPU and the host's busy share, % of a core.
	probePods                   int
	probeHTTPCPU, probeHTTPHost float64
	probeFloorCPU               float64 // the same probes in raw system calls
	probeExecCPU, probeExecHost float64
	// Start (to healthy) with large tarballs in the images dir, seconds.
	imagesFirstStart, imagesSecondStart float64
	imagesImported                      float64 // first start to all images in
	apiGetPods                          int
	binaryMiB                           float64
	shims                               shimMeasures // multi-container pods
	logTP                               logThroughput
}

type bench struct {
	cfg   Config
	env   *env
	floor *floor
	node  *node
	fw    *watcher // floor namespace
	nw    *watcher // noderun namespace
	m     measurements
	kube  kubeMeasures
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.cfg.Log, "bench: "+format+"\n", args...)
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func podNames(prefix string, n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%03d", prefix, i)
	}
	return names
}

// measureAll runs every measure. Each repetition runs the floor and noderun
// back to back, alternating which goes first, so drift over the run hits
// both alike.
func (b *bench) measureAll(ctx context.Context) error {
	if err := b.idleMemory(ctx); err != nil {
		return err
	}
	b.logf("warm-up")
	if _, _, err := b.floorPods(ctx, "warm", 1, nil, nil); err != nil {
		return fmt.Errorf("floor warm-up: %w", err)
	}
	if _, _, err := b.nodePods(ctx, "warm", 1, nil, nil, nil); err != nil {
		return fmt.Errorf("noderun warm-up: %w", err)
	}
	for r := range b.cfg.Runs {
		b.logf("one pod, run %d/%d", r+1, b.cfg.Runs)
		if err := b.onePod(ctx, r); err != nil {
			return err
		}
	}
	for r := range b.cfg.InitRuns {
		b.logf("pod with init containers, run %d/%d", r+1, b.cfg.InitRuns)
		if err := b.initPod(ctx, r); err != nil {
			return err
		}
	}
	for _, n := range b.cfg.Bursts {
		b.m.burst[n], b.m.burstCPU[n], b.m.teardown[n] = &pair{}, &pair{}, &pair{}
		for r := range b.cfg.BurstRuns {
			b.logf("burst of %d, run %d/%d", n, r+1, b.cfg.BurstRuns)
			if err := b.burst(ctx, n, r); err != nil {
				return err
			}
		}
	}
	if b.cfg.ShimPods > 0 {
		if err := b.shimGroups(ctx); err != nil {
			return err
		}
	}
	if b.cfg.LogWindow > 0 {
		if err := b.measureLogThroughput(ctx, b.cfg.LogWindow); err != nil {
			return err
		}
	}
	if b.cfg.ProbePods > 0 {
		if err := b.probeCPU(ctx); err != nil {
			return err
		}
	}
	if b.cfg.ImageTarballs > 0 {
		return b.imagesDirStart(ctx)
	}
	return nil
}

func (b *bench) onePod(ctx context.Context, rep int) error {
	return alternate(rep, func() error {
		start, down, err := b.floorPods(ctx, fmt.Sprintf("f1r%d", rep), 1, nil, nil)
		b.m.onePod.floor = append(b.m.onePod.floor, start.Seconds())
		b.m.onePodTeardown.floor = append(b.m.onePodTeardown.floor, down.Seconds())
		return err
	}, func() error {
		var api time.Duration
		start, down, err := b.nodePods(ctx, fmt.Sprintf("n1r%d", rep), 1, &api, nil, nil)
		b.m.onePod.noderun = append(b.m.onePod.noderun, start.Seconds())
		b.m.onePodAPI = append(b.m.onePodAPI, api.Seconds())
		b.m.onePodTeardown.noderun = append(b.m.onePodTeardown.noderun, down.Seconds())
		return err
	})
}

func (b *bench) burst(ctx context.Context, n, rep int) error {
	return alternate(rep, func() error {
		var cpu time.Duration
		start, down, err := b.floorPods(ctx, fmt.Sprintf("f%dr%d", n, rep), n, &cpu, nil)
		b.m.burst[n].floor = append(b.m.burst[n].floor, start.Seconds())
		b.m.burstCPU[n].floor = append(b.m.burstCPU[n].floor, msPerPod(cpu, n))
		b.m.teardown[n].floor = append(b.m.teardown[n].floor, down.Seconds())
		return err
	}, func() error {
		last := rep == b.cfg.BurstRuns-1
		var cpu time.Duration
		start, down, err := b.nodePods(ctx, fmt.Sprintf("n%dr%d", n, rep), n, nil, &cpu, func(names []string) error {
			return b.whileRunning(ctx, names, last)
		})
		b.m.burst[n].noderun = append(b.m.burst[n].noderun, start.Seconds())
		b.m.burstCPU[n].noderun = append(b.m.burstCPU[n].noderun, msPerPod(cpu, n))
		b.m.teardown[n].noderun = append(b.m.teardown[n].noderun, down.Seconds())
		return err
	})
}

func msPerPod(d time.Duration, n int) float64 { return float64(d.Milliseconds()) / float64(n) }

// alternate runs the floor first on even repetitions, noderun first on odd.
func alternate(rep int, floor, node func() error) error {
	first, second := floor, node
	if rep%2 == 1 {
		first, second = node, floor
	}
	if err := first(); err != nil {
		return err
	}
	return second()
}

// idleMemory samples noderun's memory with no pod, after start.
func (b *bench) idleMemory(ctx context.Context) error {
	for range 3 {
		if err := sleep(ctx, time.Second); err != nil {
			return err
		}
		if err := b.sampleMemory(ctx, 0); err != nil {
			return err
		}
	}
	return nil
}

func (b *bench) sampleMemory(ctx context.Context, pods int) error {
	rss, anon, err := b.node.memory()
	if err != nil {
		return err
	}
	// PSS before the heap profile: serving it (a GC and the profile's
	// encoding) grows noderun's memory for a while, so a PSS read after it
	// came out above the RSS read before.
	pss, err := b.measurePSS()
	if err != nil {
		return err
	}
	heap, err := b.node.liveHeap(ctx)
	if err != nil {
		return err
	}
	b.m.pss[pods] = append(b.m.pss[pods], pss)
	b.m.rss[pods] = append(b.m.rss[pods], rss)
	b.m.anon[pods] = append(b.m.anon[pods], anon)
	b.m.heap[pods] = append(b.m.heap[pods], heap)
	return nil
}

// floorPods starts n pods directly, in parallel, and tears them down the
// same way. With cpu set, it gets the machine's busy time over the start;
// whileUp, if set, runs once they settled.
func (b *bench) floorPods(ctx context.Context, prefix string, n int, cpu *time.Duration, whileUp func() error) (start, down time.Duration, err error) {
	return b.timeFloor(ctx, n, cpu, whileUp, func(ctx context.Context) (func(context.Context) error, error) {
		pods, err := b.floor.startAll(ctx, podNames(prefix, n))
		return func(ctx context.Context) error {
			return b.floor.stopAll(ctx, slices.DeleteFunc(pods, func(p *floorPod) bool { return p == nil }))
		}, err
	})
}

// timeFloor times one floor run: begin starts it and returns how to undo
// it. start runs until containerd reported runs processes started, down
// until the undo left no container or pinned namespace. A failure before
// the undo succeeded undoes it within cleanupTime. With cpu set, it gets
// the machine's busy time over the start.
func (b *bench) timeFloor(ctx context.Context, runs int, cpu *time.Duration, whileUp func() error, begin func(context.Context) (func(context.Context) error, error)) (start, down time.Duration, retErr error) {
	if err := sleep(ctx, settle); err != nil {
		return 0, 0, err
	}
	b.fw.drain()
	busy0, err := hostBusy()
	if err != nil {
		return 0, 0, err
	}
	t0 := time.Now()
	undo, err := begin(ctx)
	defer func() {
		if retErr != nil && undo != nil {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTime)
			defer cancel()
			retErr = errors.Join(retErr, undo(cctx))
		}
	}()
	if err != nil {
		return 0, 0, err
	}
	at, err := b.fw.waitN(ctx, topicStart, runs, waitTimeout)
	if err != nil {
		return 0, 0, err
	}
	start = at.Sub(t0)
	if err := busySince(busy0, cpu); err != nil {
		return start, 0, err
	}
	if err := sleep(ctx, settle); err != nil {
		return start, 0, err
	}
	if whileUp != nil {
		if err := whileUp(); err != nil {
			return start, 0, err
		}
	}
	b.fw.drain()
	t0 = time.Now()
	if err := undo(ctx); err != nil {
		return start, 0, err
	}
	undo = nil // done; nothing left for the deferred cleanup
	end, err := gone(ctx, b.fw, b.floor.podsDir, runs)
	if err != nil {
		return start, 0, err
	}
	return start, end.Sub(t0), checkEmpty(ctx, b.env.client, floorNS)
}

// nodePods writes n manifests at once and removes them again. start runs
// until containerd reported every process started, down until no container
// or pinned namespace is left. With api set, the status API is watched
// (through the Kubernetes API) meanwhile and api gets the time until it
// reported all Running. With cpu set, it gets the machine's busy time over
// the start. whileUp, if set, runs once all pods are Running and settled.
func (b *bench) nodePods(ctx context.Context, prefix string, n int, api, cpu *time.Duration, whileUp func(names []string) error) (start, down time.Duration, err error) {
	if err := sleep(ctx, settle); err != nil {
		return 0, 0, err
	}
	names := podNames(prefix, n)
	b.nw.drain()
	var apiRunning func() (time.Time, error)
	if api != nil {
		watchCtx, stopWatch := context.WithCancel(ctx)
		defer stopWatch()
		if apiRunning, err = b.node.watchRunning(watchCtx, names, waitTimeout); err != nil {
			return 0, 0, err
		}
	}
	busy0, err := hostBusy()
	if err != nil {
		return 0, 0, err
	}
	t0, err := b.node.writeManifests(names)
	if err != nil {
		return 0, 0, err
	}
	at, err := b.nw.waitN(ctx, topicStart, n, waitTimeout)
	if err != nil {
		return 0, 0, err
	}
	start = at.Sub(t0)
	if err := busySince(busy0, cpu); err != nil {
		return start, 0, err
	}
	if api != nil {
		at, err := apiRunning()
		if err != nil {
			return start, 0, err
		}
		*api = at.Sub(t0)
	} else if _, err := b.node.waitRunning(ctx, names, 100*time.Millisecond, waitTimeout); err != nil {
		return start, 0, err
	}
	if err := sleep(ctx, settle); err != nil {
		return start, 0, err
	}
	if whileUp != nil {
		if err := whileUp(names); err != nil {
			return start, 0, err
		}
	}
	down, err = b.removeNodePods(ctx, names, n)
	return start, down, err
}

// removeNodePods removes the pods' manifests and times them until runs
// containers were deleted and no namespace is pinned; it then checks that
// noderun left nothing in its namespace.
func (b *bench) removeNodePods(ctx context.Context, names []string, runs int) (time.Duration, error) {
	b.nw.drain()
	t0, err := b.node.removeManifests(names)
	if err != nil {
		return 0, err
	}
	end, err := gone(ctx, b.nw, b.node.podsDir, runs)
	if err != nil {
		return 0, err
	}
	down := end.Sub(t0)
	if err := b.node.waitNoPods(ctx, waitTimeout); err != nil {
		return down, err
	}
	return down, checkEmpty(ctx, b.env.client, noderunNS)
}

// gone returns when n containers were deleted and no namespace is pinned
// under podsDir; tasks go before their containers.
func gone(ctx context.Context, w *watcher, podsDir string, n int) (time.Time, error) {
	deleted, err := w.waitN(ctx, topicDelete, n, waitTimeout)
	if err != nil {
		return time.Time{}, err
	}
	unpinned, err := waitNoNetNS(ctx, podsDir, waitTimeout)
	if err != nil {
		return time.Time{}, err
	}
	if unpinned.After(deleted) {
		return unpinned, nil
	}
	return deleted, nil
}

// whileRunning takes what is measured with a burst's pods up: memory, and
// on the largest burst's last run the idle CPU and the status API latency.
func (b *bench) whileRunning(ctx context.Context, names []string, lastRun bool) error {
	n := len(names)
	if err := b.sampleMemory(ctx, n); err != nil {
		return err
	}
	if n != slices.Max(b.cfg.Bursts) || !lastRun {
		return nil
	}
	b.logf("steady state with %d pods: CPU over %s", n, b.cfg.CPUWindow)
	cpu0, err := b.node.cpuTime()
	if err != nil {
		return err
	}
	busy0, total0, err := hostCPU()
	if err != nil {
		return err
	}
	t0 := time.Now()
	if err := sleep(ctx, b.cfg.CPUWindow); err != nil {
		return err
	}
	cpu1, err := b.node.cpuTime()
	if err != nil {
		return err
	}
	busy1, total1, err := hostCPU()
	if err != nil {
		return err
	}
	b.m.cpuPercent = 100 * float64(cpu1-cpu0) / float64(time.Since(t0))
	b.m.hostBusyPercent = 100 * float64(busy1-busy0) / float64(max(total1-total0, 1))
	b.m.cpuPods = n
	// Nothing may have changed meanwhile.
	if _, err := b.node.waitRunning(ctx, names, 0, 0); err != nil {
		return fmt.Errorf("after the CPU window: %w", err)
	}
	for range b.cfg.APIGets {
		t := time.Now()
		_, at, err := b.node.get(ctx, "/pods")
		if err != nil {
			return err
		}
		b.m.apiGetMS = append(b.m.apiGetMS, float64(at.Sub(t))/float64(time.Millisecond))
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
	b.m.apiGetPods = n
	return b.kubeAPI(ctx, n)
}
