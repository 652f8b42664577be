package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/noderun/noderun/internal/testnode"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const nodeName = "bench"

// podCommand keeps the container running until SIGTERM ends it at once (sh
// as PID 1 ignores signals it has no trap for). The sleep is long so that
// 100 idle pods do not fork 100 times a second on a 2-core machine and blur
// the CPU and timing figures.
var podCommand = []string{"sh", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait; done"}

// node is the noderun process under test, with directories of its own.
type node struct {
	dir, manifests, podsDir, socket string
	stateDir                        string // its --state-dir
	proc                            *testnode.Process
	api                             *testnode.StatusClient
}

func startNode(ctx context.Context, e *env) (*node, error) {
	return startNodeIn(ctx, e, filepath.Join(e.dir, "node"), noderunNS, []string{e.imageTar})
}

// startNodeIn starts a noderun with its files under dir, in containerd
// namespace ns, with the given tarballs linked into its images dir, and
// returns once it is healthy.
func startNodeIn(ctx context.Context, e *env, dir, ns string, tars []string) (*node, error) {
	n := &node{
		dir:       dir,
		manifests: filepath.Join(dir, "manifests"),
		stateDir:  filepath.Join(dir, "state"),
		podsDir:   filepath.Join(dir, "run", "pods"), // where noderun pins pod namespaces
		socket:    filepath.Join(dir, "run", "noderun.sock"),
	}
	// Long enough for a CPU profile, which answers only at its end.
	n.api = testnode.NewStatusClient(n.socket, 5*time.Minute, true)
	if err := e.runState(filepath.Join(dir, "run")); err != nil {
		return nil, err
	}
	images := filepath.Join(dir, "images")
	for _, d := range []string{n.manifests, images} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	for _, tar := range tars {
		if err := os.Link(tar, filepath.Join(images, filepath.Base(tar))); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, err
		}
	}
	logPath, level := filepath.Join(dir, "noderun.log"), "info"
	if e.cfg.NodeLog != "" && ns == noderunNS {
		// Debug level: the timings of each pod's start phases.
		logPath, level = e.cfg.NodeLog, "debug"
	}
	args := testnode.Flags{
		Manifests: n.manifests, NodeName: nodeName,
		StateDir: n.stateDir, RunDir: filepath.Join(dir, "run"), LogDir: filepath.Join(dir, "logs"), ImagesDir: images,
		ContainerdAddress: e.daemon.Address(), Namespace: ns,
		CNIConfDir: e.nodeCNIDir, PodCIDR: e.nodeSubnet, PodBridge: e.nodeBridge,
		StatusSocket: n.socket, LogLevel: level,
	}.Args()
	var err error
	if n.proc, err = testnode.Start(exec.Command(e.bin, args...), logPath, true); err != nil {
		return nil, err
	}
	if err := testnode.WaitHealthy(ctx, n.proc, n.api, time.Minute, 50*time.Millisecond); err != nil {
		return n, fmt.Errorf("%w; see %s", err, logPath)
	}
	return n, nil
}

func (n *node) pid() int { return n.proc.Process.Pid }

// stop asks noderun to exit (its pods would keep running) and kills it by
// PID if it does not.
func (n *node) stop() {
	if !n.proc.Running() {
		return
	}
	n.proc.Stop(20 * time.Second)
	// The collector outlives noderun, as it should on a host (it logs
	// while noderun restarts); the bench's node ends with it, or it would
	// keep the bench dir's filesystem busy.
	if pid, err := n.collectorPID(); err == nil {
		testnode.EndProcess(pid, 10*time.Second)
	}
}

// get fetches a status API path and returns the body and when it had all
// arrived.
func (n *node) get(ctx context.Context, path string) ([]byte, time.Time, error) {
	return n.api.Fetch(ctx, path)
}

// save writes what a status API path answers (a profile) to file.
func (n *node) save(ctx context.Context, path, file string) error {
	b, _, err := n.get(ctx, path)
	if err != nil {
		return err
	}
	return os.WriteFile(file, b, 0o644)
}

func (n *node) pods(ctx context.Context) ([]v1.Pod, time.Time, error) { return n.api.Pods(ctx) }

// waitRunning polls the status API every `every` until each named pod is
// Running, and returns when the answer saying so arrived.
func (n *node) waitRunning(ctx context.Context, names []string, every, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	for {
		pods, at, err := n.pods(ctx)
		if err != nil {
			return time.Time{}, err
		}
		ok := 0
		for i := range pods {
			if slices.Contains(names, strings.TrimSuffix(pods[i].Name, "-"+nodeName)) && testnode.PodRunning(&pods[i]) {
				ok++
			}
		}
		if ok == len(names) {
			return at, nil
		}
		if at.After(deadline) {
			return time.Time{}, fmt.Errorf("%d of %d pods Running in the status API after %s", ok, len(names), timeout)
		}
		select {
		case <-time.After(every):
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		}
	}
}

// waitNoPods waits until the status API lists no pod, i.e. noderun has
// finished every teardown, before the next measurement starts.
func (n *node) waitNoPods(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		pods, at, err := n.pods(ctx)
		if err != nil {
			return err
		}
		if len(pods) == 0 {
			return nil
		}
		if at.After(deadline) {
			return fmt.Errorf("status API still lists %d pods after %s", len(pods), timeout)
		}
		select {
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func manifestFile(name string) string { return name + ".json" }

// writeManifests writes each pod to a dot-file (which noderun ignores), then
// renames them all into place; it returns when the first rename began.
func (n *node) writeManifests(names []string) (time.Time, error) {
	return n.writeManifestsWith(names, nil)
}

// writeManifestsWith is writeManifests with the container changed by mutate.
func (n *node) writeManifestsWith(names []string, mutate func(*v1.Container)) (time.Time, error) {
	return n.writePods(names, func(s *v1.PodSpec) {
		if mutate != nil {
			mutate(&s.Containers[0])
		}
	})
}

// writePods is writeManifests with the pod spec changed by mutate.
func (n *node) writePods(names []string, mutate func(*v1.PodSpec)) (time.Time, error) {
	grace := int64(10)
	return placeManifests(n.manifests, names, func(name string) ([]byte, error) {
		spec := v1.PodSpec{
			TerminationGracePeriodSeconds: &grace,
			Containers:                    []v1.Container{{Name: "main", Image: imageRef, Command: podCommand}},
		}
		mutate(&spec)
		return json.Marshal(v1.Pod{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       spec,
		})
	})
}

// placeManifests writes each pod's manifest to a dot-file in dir (which
// noderun and the kubelet ignore), then renames them all into place; it
// returns when the first rename began.
func placeManifests(dir string, names []string, manifest func(name string) ([]byte, error)) (time.Time, error) {
	for _, name := range names {
		b, err := manifest(name)
		if err != nil {
			return time.Time{}, err
		}
		if err := os.WriteFile(filepath.Join(dir, "."+manifestFile(name)), b, 0o644); err != nil {
			return time.Time{}, err
		}
	}
	t0 := time.Now()
	for _, name := range names {
		if err := os.Rename(filepath.Join(dir, "."+manifestFile(name)), filepath.Join(dir, manifestFile(name))); err != nil {
			return t0, err
		}
	}
	return t0, nil
}

// removeManifests removes the pods' files; it returns when the first
// removal began.
func (n *node) removeManifests(names []string) (time.Time, error) {
	t0 := time.Now()
	for _, name := range names {
		if err := os.Remove(filepath.Join(n.manifests, manifestFile(name))); err != nil {
			return t0, err
		}
	}
	return t0, nil
}

// removeAllManifests empties the manifest dir, for the final cleanup.
func (n *node) removeAllManifests() {
	ents, _ := os.ReadDir(n.manifests)
	for _, e := range ents {
		_ = os.Remove(filepath.Join(n.manifests, e.Name()))
	}
}

const mib = 1 << 20

// memory is noderun's resident memory in MiB: all of it (VmRSS) and the
// anonymous part (RssAnon: heap, stacks, runtime), the rest being mostly the
// binary's pages.
func (n *node) memory() (rss, anon float64, err error) {
	kb, err := testnode.StatusValues(n.pid(), "VmRSS", "RssAnon")
	if err != nil {
		return 0, 0, err
	}
	return kb["VmRSS"] / 1024, kb["RssAnon"] / 1024, nil
}

// liveHeap is noderun's Go heap in MiB right after a GC (HeapAlloc), from
// the runtime.MemStats the heap profile ends with.
func (n *node) liveHeap(ctx context.Context) (float64, error) {
	b, _, err := n.get(ctx, "/debug/pprof/heap?debug=1&gc=1")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "# HeapAlloc = "); ok {
			n, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return n / mib, err
		}
	}
	return 0, errors.New("heap profile has no HeapAlloc")
}

// cpuTime is noderun's user+system CPU time so far.
func (n *node) cpuTime() (time.Duration, error) { return testnode.CPUTime(n.pid()) }
