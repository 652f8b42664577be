package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

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
	cmd                             *exec.Cmd
	done                            chan struct{} // closed once noderun has exited
	api                             *http.Client
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
		done:      make(chan struct{}),
	}
	// Long enough for a CPU profile, which answers only at its end.
	n.api = &http.Client{Timeout: 5 * time.Minute, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", n.socket)
		},
	}}
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
	out, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer out.Close() // the child has its own copy
	n.cmd = exec.Command(e.bin, "--log-level", level,
		"--manifests", n.manifests,
		"--node-name", nodeName,
		"--state-dir", n.stateDir,
		"--run-dir", filepath.Join(dir, "run"),
		"--pod-log-dir", filepath.Join(dir, "logs"),
		"--images-dir", images,
		"--containerd-address", e.daemon.Address(),
		"--containerd-namespace", ns,
		"--cni-conf-dir", e.nodeCNIDir,
		"--pod-cidr", e.nodeSubnet,
		"--pod-bridge", e.nodeBridge,
		"--cni-bin-dir", cniBinDir,
		"--status-socket", n.socket,
		"--api-port", "0", // never the port of a noderun running on the host
	)
	n.cmd.Stdout, n.cmd.Stderr = out, out
	// Should the bench die without cleaning up, noderun goes with it.
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	started := make(chan error, 1)
	go func() {
		// Pdeathsig fires when the forking thread exits, and the floor ends
		// threads (cni.CreateNamespaces discards the one it unshares on).
		// This thread stays locked, and alive, until noderun exits.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := n.cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = n.cmd.Wait()
		close(n.done)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	if err := n.waitHealthy(ctx, time.Minute); err != nil {
		return n, err
	}
	return n, nil
}

func (n *node) pid() int { return n.cmd.Process.Pid }

func (n *node) running() bool {
	select {
	case <-n.done:
		return false
	default:
		return true
	}
}

func (n *node) waitHealthy(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if !n.running() {
			return fmt.Errorf("noderun exited during start: %s; see %s", n.cmd.ProcessState, filepath.Join(n.dir, "noderun.log"))
		}
		_, _, err := n.get(ctx, "/healthz")
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("noderun not healthy after %s: %w", timeout, err)
		}
		select {
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// stop asks noderun to exit (its pods would keep running) and kills it by
// PID if it does not.
func (n *node) stop() {
	if !n.running() {
		return
	}
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.done:
	case <-time.After(20 * time.Second):
		_ = n.cmd.Process.Kill()
		<-n.done
	}
	// The collector outlives noderun, as it should on a host (it logs
	// while noderun restarts); the bench's node ends with it, or it would
	// keep the bench dir's filesystem busy.
	if pid, err := n.collectorPID(); err == nil {
		endProcess(pid, 10*time.Second)
	}
}

// endProcess sends pid SIGTERM and waits until it is gone (init reaps it),
// or kills it after timeout.
func endProcess(pid int, timeout time.Duration) {
	_ = syscall.Kill(pid, syscall.SIGTERM)
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if syscall.Kill(pid, 0) != nil {
			return
		}
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
}

// get fetches a status API path and returns the body and when it had all
// arrived.
func (n *node) get(ctx context.Context, path string) ([]byte, time.Time, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://noderun"+path, nil)
	if err != nil {
		return nil, time.Time{}, err
	}
	resp, err := n.api.Do(req)
	if err != nil {
		return nil, time.Time{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	at := time.Now()
	if err != nil {
		return nil, at, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, at, fmt.Errorf("GET %s: %s: %s", path, resp.Status, bytes.TrimSpace(b))
	}
	return b, at, nil
}

// save writes what a status API path answers (a profile) to file.
func (n *node) save(ctx context.Context, path, file string) error {
	b, _, err := n.get(ctx, path)
	if err != nil {
		return err
	}
	return os.WriteFile(file, b, 0o644)
}

func (n *node) pods(ctx context.Context) ([]v1.Pod, time.Time, error) {
	b, at, err := n.get(ctx, "/pods")
	if err != nil {
		return nil, at, err
	}
	var list v1.PodList
	return list.Items, at, json.Unmarshal(b, &list)
}

func podRunning(p *v1.Pod) bool {
	return p.Status.Phase == v1.PodRunning && len(p.Status.ContainerStatuses) > 0 &&
		!slices.ContainsFunc(p.Status.ContainerStatuses, func(cs v1.ContainerStatus) bool { return cs.State.Running == nil })
}

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
			if slices.Contains(names, strings.TrimSuffix(pods[i].Name, "-"+nodeName)) && podRunning(&pods[i]) {
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
	for _, name := range names {
		spec := v1.PodSpec{
			TerminationGracePeriodSeconds: &grace,
			Containers:                    []v1.Container{{Name: "main", Image: imageRef, Command: podCommand}},
		}
		mutate(&spec)
		b, err := json.Marshal(v1.Pod{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       spec,
		})
		if err != nil {
			return time.Time{}, err
		}
		if err := os.WriteFile(filepath.Join(n.manifests, "."+manifestFile(name)), b, 0o644); err != nil {
			return time.Time{}, err
		}
	}
	t0 := time.Now()
	for _, name := range names {
		if err := os.Rename(filepath.Join(n.manifests, "."+manifestFile(name)), filepath.Join(n.manifests, manifestFile(name))); err != nil {
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
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", n.pid()))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	fields := map[string]*float64{"VmRSS:": &rss, "RssAnon:": &anon}
	found := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		f := strings.Fields(sc.Text()) // e.g. "VmRSS:", "38124", "kB"
		if len(f) < 2 {
			continue
		}
		if dst, ok := fields[f[0]]; ok {
			kb, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				return 0, 0, fmt.Errorf("/proc status %s: %w", f[0], err)
			}
			*dst = kb / 1024
			found++
		}
	}
	if found != len(fields) {
		return 0, 0, errors.New("no VmRSS or RssAnon in /proc status")
	}
	return rss, anon, sc.Err()
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

// userHZ is the unit of /proc/stat and /proc/<pid>/stat times; the kernel fixes it at 100
// for user space.
const userHZ = 100

// cpuTime is noderun's user+system CPU time so far.
func (n *node) cpuTime() (time.Duration, error) { return procCPU(n.pid()) }

// procCPU is a process's user+system CPU time so far.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// After the parenthesised command name (which may hold ')'): state is
	// field 3, utime 14, stime 15.
	i := bytes.LastIndexByte(b, ')')
	fields := strings.Fields(string(b[i+1:]))
	if i < 0 || len(fields) < 13 {
		return 0, errors.New("short /proc stat")
	}
	var ticks uint64
	for _, f := range fields[11:13] {
		v, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return 0, err
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}
