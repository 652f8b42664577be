package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd"
	tasksapi "github.com/containerd/containerd/api/services/tasks/v1"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/snapshots"
	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/cni"
	"github.com/noderun/noderun/crilog"
	"github.com/noderun/noderun/internal/ociimage"
	"github.com/noderun/noderun/internal/testenv"
	"github.com/noderun/noderun/internal/testnode"
	ctrdrt "github.com/noderun/noderun/runner/containerd"
)

const (
	nodeName    = "e2e"
	cniBinDir   = testnode.CNIBinDir
	snapshotter = "overlayfs" // what noderun uses
	pollEvery   = 100 * time.Millisecond
	waitTimeout = 30 * time.Second
	// cleanupTimeout bounds a node's teardown of its pods at a test's end.
	cleanupTimeout = 50 * time.Second
	// podUIDFilter selects one pod's containers; the label is noderun's.
	podUIDFilter = `labels."` + ctrdrt.LabelPodUID + `"==%q`
)

// imageNames are the names the busybox tarball carries; manifests use them
// with the default pull policy of a tagged image (IfNotPresent), so nothing
// is ever pulled.
var imageNames = []string{"docker.io/library/busybox:1.36", "registry.k8s.io/busybox:1.27.2"}

// Set once by TestMain, read-only afterwards.
var (
	noderunBin string
	imageTar   string
	workDir    string // the suite's temporary dir, removed at the end
	ctrdSocket string
	client     *containerd.Client
	missing    string // a missing prerequisite; tests skip (or fail under CI=true)
	setupErr   error  // prerequisites are there but the shared setup failed
)

func TestMain(m *testing.M) {
	flag.Parse()
	// The tests mostly wait (probe periods, grace periods); with the
	// default of GOMAXPROCS at a time, the long ones would queue.
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "test.parallel" })
	if !explicit {
		_ = flag.Set("test.parallel", "6")
	}
	os.Exit(runTests(m))
}

// runTests does the expensive shared setup once: the noderun binary, the
// image tarball and one private containerd whose namespaces keep tests apart.
func runTests(m *testing.M) int {
	if testing.Short() {
		return m.Run()
	}
	// NODERUN_TEST_CONTAINERD picks the containerd and runc pair (make
	// test-runtimes runs each); a pair that cannot be built fails the tests.
	if _, err := testnode.UseRuntime(context.Background()); err != nil {
		setupErr = err
		return m.Run()
	}
	if missing = testnode.MissingPrerequisite(); missing != "" {
		return m.Run()
	}
	// A short path: containerd's socket lives here and must fit sun_path.
	dir, err := os.MkdirTemp("/tmp", "nre")
	if err == nil {
		err = traversable(dir)
	}
	if err != nil {
		setupErr = err
		return m.Run()
	}
	defer os.RemoveAll(dir)
	stop, err := setup(dir)
	if err != nil {
		setupErr = err
		return m.Run()
	}
	defer stop()
	return m.Run()
}

func setup(dir string) (stop func(), err error) {
	workDir = dir
	noderunBin = filepath.Join(dir, "noderun")
	// The test runs in e2e/, so ".." is the main package.
	// Built as the Makefile builds it: the log driver first, then noderun
	// embedding it.
	root, err := filepath.Abs("..")
	if err != nil {
		return nil, err
	}
	if _, err := testnode.Build(context.Background(), root, noderunBin); err != nil {
		return nil, err
	}
	var imgs []ociimage.Image
	for _, name := range imageNames {
		img, err := ociimage.Busybox(name)
		if err != nil {
			return nil, err
		}
		imgs = append(imgs, img)
	}
	imageTar = filepath.Join(dir, "busybox.tar")
	if err := ociimage.WriteFile(imageTar, imgs...); err != nil {
		return nil, err
	}
	ctx := context.Background()
	d, c, err := testnode.StartContainerd(ctx, filepath.Join(dir, "root"), filepath.Join(dir, "state"),
		filepath.Join(dir, "c.sock"), filepath.Join(dir, "containerd.log"))
	if err != nil {
		return nil, err
	}
	fmt.Fprintln(os.Stderr, "e2e runs", testnode.RuntimeVersions(ctx))
	startKubectlBuild()
	ctrdSocket, client = d.Address(), c
	return func() {
		client.Close()
		ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		if err := d.Stop(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "stop containerd:", err)
		}
	}, nil
}

// traversable opens a temporary dir for traversal by anyone, as
// containerd's and noderun's own dirs are (0711): runc's init in a user
// namespace of a pod's own (hostUsers: false) is an unprivileged host ID
// when it walks to the container's bundle.
func traversable(dir string) error { return os.Chmod(dir, 0o711) }

// requireE2E skips under -short or without prerequisites, except that CI=true
// turns a missing prerequisite into a failure: there a skip would hide that
// nothing was tested.
func requireE2E(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end test; skipped with -short")
	}
	testenv.Require(t, missing == "", missing)
	if setupErr != nil {
		t.Fatalf("e2e setup: %v", setupErr)
	}
}

// node is one noderun process with private directories, containerd
// namespace, bridge and subnet.
type node struct {
	t                                       *testing.T
	bin                                     string // the noderun binary
	ns                                      string
	root, state, run, logs, images, podsDir string
	cniConf, socket, out                    string
	bridge, subnet, netName                 string
	api                                     *testnode.StatusClient
	extraArgs                               []string // more noderun flags
	extraEnv                                []string // more of noderun's environment

	proc *testnode.Process
}

// Bridges and subnets are handed out per test so parallel tests never share
// one. Each test process starts at its own offset, and claims each name
// (testnode.ClaimNetwork), so two suites run at once (two checkouts on one
// machine) never use the same one.
var (
	netMu   sync.Mutex
	netNext = os.Getpid() % 254
	netUsed int
)

func allocNet(t *testing.T) int {
	t.Helper()
	netMu.Lock()
	defer netMu.Unlock()
	for ; netUsed < 254; netUsed++ {
		n := 1 + netNext%254
		netNext++
		bridge := fmt.Sprintf("nre2e%d", n)
		release, ok, err := testnode.ClaimNetwork(bridge)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			continue // another suite's, now or soon
		}
		// A bridge there is left by an interrupted run.
		if testnode.NetworkFree(bridge, fmt.Sprintf("10.211.%d.0/24", n)) != nil {
			release()
			continue
		}
		// Registered before the node's own cleanups, so it runs after them:
		// the name is free again only once the bridge is gone.
		t.Cleanup(release)
		netUsed++
		return n
	}
	t.Fatal("no free bridge and subnet")
	return 0
}

// newNode prepares a node and starts noderun on it, with extra flags if
// given; cleanup tears it all down.
func newNode(t *testing.T, extraArgs ...string) *node {
	t.Helper()
	return newNodeWithImages(t, nil, extraArgs...)
}

// newNodeWithImages starts a node whose images dir also holds the given
// image tarballs (built by the test), so they are there before any pod.
func newNodeWithImages(t *testing.T, tars []string, extraArgs ...string) *node {
	t.Helper()
	return newNodeOf(t, noderunBin, tars, extraArgs...)
}

// newNodeOf starts a node that runs the noderun binary bin.
func newNodeOf(t *testing.T, bin string, tars []string, extraArgs ...string) *node {
	t.Helper()
	return newNodeEnv(t, bin, tars, nil, extraArgs...)
}

// newNodeEnv starts a node that runs bin with env added to its own.
func newNodeEnv(t *testing.T, bin string, tars, env []string, extraArgs ...string) *node {
	t.Helper()
	n := prepareNode(t, extraArgs...)
	n.bin, n.extraEnv = bin, env
	for _, d := range []string{n.state, n.run, n.logs} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for i, tar := range tars {
		if err := os.Link(tar, filepath.Join(n.images, fmt.Sprintf("extra-%d.tar", i))); err != nil {
			t.Fatal(err)
		}
	}
	n.start()
	return n
}

// prepareNode gives a node its names, an images dir with the busybox
// tarball, and empty manifest and CNI config dirs; noderun's own dirs and
// the network config are left to the caller, and it is not started.
func prepareNode(t *testing.T, extraArgs ...string) *node {
	t.Helper()
	requireE2E(t)
	root, err := os.MkdirTemp("/tmp", "nre")
	if err == nil {
		err = traversable(root)
	}
	if err != nil {
		t.Fatal(err)
	}
	idx := allocNet(t)
	n := &node{
		t: t, root: root, bin: noderunBin,
		ns:      fmt.Sprintf("e2e-%d-%s", idx, nsSuffix(t.Name())),
		state:   filepath.Join(root, "s"),
		run:     filepath.Join(root, "r"),
		logs:    filepath.Join(root, "l"),
		images:  filepath.Join(root, "i"),
		podsDir: filepath.Join(root, "m"),
		cniConf: filepath.Join(root, "c"),
		out:     filepath.Join(root, "noderun.out"),
		bridge:  fmt.Sprintf("nre2e%d", idx),
		subnet:  fmt.Sprintf("10.211.%d.0/24", idx),
		netName: fmt.Sprintf("nre2e%d", idx),

		extraArgs: extraArgs,
	}
	n.socket = filepath.Join(n.run, "noderun.sock")
	n.api = testnode.NewStatusClient(n.socket, 5*time.Second, false)
	t.Cleanup(n.cleanup)
	for _, d := range []string{n.images, n.podsDir, n.cniConf} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Link(imageTar, filepath.Join(n.images, "busybox.tar")); err != nil {
		t.Fatal(err)
	}
	return n
}

func nsSuffix(name string) string {
	name = strings.ToLower(strings.TrimPrefix(name, "Test"))
	name = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return -1
	}, name)
	return name[:min(len(name), 40)]
}

// resetCNIConfig removes noderun's default config, which it writes (on the
// test's bridge and subnet, --pod-bridge and --pod-cidr) when it starts
// with none: after a change of state dir, whose IPAM dir the default names.
func (n *node) resetCNIConfig() {
	if err := os.Remove(filepath.Join(n.cniConf, "10-noderun.conflist")); err != nil && !os.IsNotExist(err) {
		n.t.Fatal(err)
	}
}

// writeCNIConfigWith writes a config of the test's own (so it runs whole,
// where noderun's default runs per pod), the default's shape with plugins
// added before loopback; noderun picks a changed config up for new pods.
func (n *node) writeCNIConfigWith(extra ...map[string]any) {
	type obj = map[string]any
	conf := obj{
		"cniVersion": "1.0.0",
		"name":       n.netName,
		"plugins": []obj{
			{
				"type": "bridge", "bridge": n.bridge, "isGateway": true, "ipMasq": true, "hairpinMode": true,
				"ipam": obj{
					"type":    "host-local",
					"ranges":  [][]obj{{{"subnet": n.subnet}}},
					"routes":  []obj{{"dst": "0.0.0.0/0"}},
					"dataDir": n.ipamDir(),
				},
			},
			{"type": "portmap", "capabilities": obj{"portMappings": true}},
		},
	}
	conf["plugins"] = append(append(conf["plugins"].([]obj), extra...), obj{"type": "loopback"})
	b, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		n.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(n.cniConf, "10-e2e.conflist"), b, 0o644); err != nil {
		n.t.Fatal(err)
	}
}

func (n *node) ipamDir() string { return filepath.Join(n.state, "cni", "networks") }

// flags are the node's noderun flags; subcommands take them too.
func (n *node) flags() []string {
	args := testnode.Flags{
		Manifests: n.podsDir, NodeName: nodeName,
		StateDir: n.state, RunDir: n.run, LogDir: n.logs, ImagesDir: n.images,
		ContainerdAddress: ctrdSocket, Namespace: n.ns,
		CNIConfDir: n.cniConf, PodCIDR: n.subnet, PodBridge: n.bridge,
		StatusSocket: n.socket, LogLevel: "debug",
	}.Args()
	args = append(args,
		// Nothing from the host's registry setup leaks into a test.
		"--registry-config-dir", filepath.Join(n.root, "certs.d"),
		"--registry-auth-file", filepath.Join(n.state, "config.json"),
		"--file-check-interval", "2s",
	)
	return append(args, n.extraArgs...)
}

// start runs noderun and waits until its status API reports healthy.
func (n *node) start() {
	t := n.t
	t.Helper()
	cmd := exec.Command(n.bin, n.flags()...)
	// Tests reach nothing off this machine: a pull from a public registry
	// (imagePullPolicy Always) meets a proxy nothing listens on instead
	// (loopback registries are never proxied).
	cmd.Env = append(os.Environ(), "HTTPS_PROXY=http://127.0.0.1:9", "HTTP_PROXY=http://127.0.0.1:9")
	cmd.Env = append(cmd.Env, n.extraEnv...)
	proc, err := testnode.Start(cmd, n.out, false)
	if err != nil {
		t.Fatal(err)
	}
	n.proc = proc
	n.waitHealthy()
	if !slices.Contains(n.extraArgs, "--containerd-address") { // a test's own daemon: its business
		n.waitImages()
	}
}

// waitImages waits until the images-dir tarballs are in: noderun imports
// them after READY, and tests that count what a pod leaves need the
// images' own snapshots in place first.
func (n *node) waitImages() {
	n.t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for _, name := range imageNames {
		for {
			img, err := client.GetImage(n.ctx(), name)
			if err == nil {
				if ok, _ := img.IsUnpacked(n.ctx(), snapshotter); ok {
					break
				}
			}
			if time.Now().After(deadline) {
				n.t.Fatalf("image %s not imported from the images dir after %s: %v", name, waitTimeout, err)
			}
			time.Sleep(pollEvery / 4)
		}
	}
}

func (n *node) running() bool { return n.proc.Running() }

func (n *node) waitHealthy() {
	n.t.Helper()
	if err := testnode.WaitHealthy(context.Background(), n.proc, n.api, waitTimeout, pollEvery); err != nil {
		n.t.Fatal(err)
	}
}

// kill9 kills noderun the hard way, as a crash would.
func (n *node) kill9() {
	n.t.Helper()
	if err := n.proc.Kill9(); err != nil {
		n.t.Fatal(err)
	}
}

// stop asks noderun to exit (pods keep running) and kills it if it does not.
func (n *node) stop() {
	if !n.running() {
		return
	}
	if !n.proc.Stop(15 * time.Second) {
		n.t.Errorf("noderun ignored SIGTERM for 15s; killed it")
		return
	}
	// It says what stopped it, so that a stop nobody asked for can be
	// traced.
	if b, err := os.ReadFile(n.out); err != nil || !strings.Contains(string(b), `cause="terminated signal received"`) {
		n.t.Errorf("noderun's log does not name SIGTERM as the cause of its stop (%v)", err)
	}
}

// get fetches a status API path; v is a *string for plain text or a value
// to decode JSON into.
func (n *node) get(path string, v any) error {
	b, _, err := n.api.Fetch(context.Background(), path)
	if err != nil {
		return err
	}
	if s, ok := v.(*string); ok {
		*s = string(b)
		return nil
	}
	return json.Unmarshal(b, v)
}

func (n *node) pods() []v1.Pod {
	n.t.Helper()
	var list v1.PodList
	if err := n.get("/pods", &list); err != nil {
		n.t.Fatal(err)
	}
	return list.Items
}

// pod returns the status of the static pod from manifest name, or nil.
func (n *node) pod(name string) *v1.Pod {
	n.t.Helper()
	for _, p := range n.pods() {
		if p.Name == name+"-"+nodeName {
			return &p
		}
	}
	return nil
}

// waitPod polls the status API until the pod exists and cond holds, and
// returns that status.
func (n *node) waitPod(name, what string, cond func(*v1.Pod) bool) *v1.Pod {
	n.t.Helper()
	return n.waitPodFor(name, what, waitTimeout, cond)
}

func (n *node) waitPodFor(name, what string, timeout time.Duration, cond func(*v1.Pod) bool) *v1.Pod {
	n.t.Helper()
	deadline := time.Now().Add(timeout)
	var last *v1.Pod
	for time.Now().Before(deadline) {
		if last = n.pod(name); last != nil && cond(last) {
			return last
		}
		time.Sleep(pollEvery)
	}
	n.t.Fatalf("pod %s: not %s after %s; last status: %s", name, what, timeout, statusJSON(last))
	return nil
}

// waitGone waits until the pod is no longer listed and returns when it
// noticed.
func (n *node) waitGone(name string, timeout time.Duration) time.Time {
	n.t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if n.pod(name) == nil {
			return time.Now()
		}
		time.Sleep(pollEvery / 2)
	}
	n.t.Fatalf("pod %s still listed after %s: %s", name, timeout, statusJSON(n.pod(name)))
	return time.Time{}
}

func statusJSON(p *v1.Pod) string {
	if p == nil {
		return "<not listed>"
	}
	b, _ := json.Marshal(struct {
		UID    string
		Status v1.PodStatus
	}{string(p.UID), p.Status})
	return string(b)
}

// running is the condition most waits are for.
var running = testnode.PodRunning

// writeManifest writes via a dot-file and a rename, so noderun (which skips
// dot-files) never reads half a manifest.
func (n *node) writeManifest(file, content string) {
	n.t.Helper()
	tmp := filepath.Join(n.podsDir, "."+file+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		n.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(n.podsDir, file)); err != nil {
		n.t.Fatal(err)
	}
}

func (n *node) removeManifest(file string) {
	n.t.Helper()
	if err := os.Remove(filepath.Join(n.podsDir, file)); err != nil {
		n.t.Fatal(err)
	}
}

// logPath is where the kubelet layout puts a container's log.
func (n *node) logPath(p *v1.Pod, container string, restart int) string {
	return filepath.Join(n.logs, fmt.Sprintf("%s_%s_%s", p.Namespace, p.Name, p.UID), container, fmt.Sprintf("%d.log", restart))
}

type logLine struct {
	time    time.Time
	stream  string
	content string
}

// readLog parses a CRI log file; a missing file is no lines.
func (n *node) readLog(path string) []logLine {
	n.t.Helper()
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		n.t.Fatal(err)
	}
	var out []logLine
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		ts, stream, _, content, err := crilog.ParseLine(sc.Text())
		if err != nil {
			n.t.Fatalf("%s: %v", path, err)
		}
		out = append(out, logLine{ts, stream, content})
	}
	return out
}

// waitLogLine waits until the log has a stdout line equal to want.
func (n *node) waitLogLine(path, want string) logLine {
	n.t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for time.Now().Before(deadline) {
		for _, l := range n.readLog(path) {
			if l.stream == crilog.Stdout && l.content == want {
				return l
			}
		}
		time.Sleep(pollEvery)
	}
	b, _ := os.ReadFile(path)
	n.t.Fatalf("log %s: no line %q after %s; it holds:\n%s", path, want, waitTimeout, b)
	return logLine{}
}

// ctx is a context in the node's containerd namespace.
func (n *node) ctx() context.Context {
	return namespaces.WithNamespace(context.Background(), n.ns)
}

// containers lists the namespace's containers, or one pod's when uid is set.
func (n *node) containers(uid string) []containers.Container {
	n.t.Helper()
	var filters []string
	if uid != "" {
		filters = append(filters, fmt.Sprintf(podUIDFilter, uid))
	}
	cs, err := client.ContainerService().List(n.ctx(), filters...)
	if err != nil {
		n.t.Fatal(err)
	}
	return cs
}

func (n *node) tasks() []*tasktypes.Process {
	n.t.Helper()
	resp, err := client.TaskService().List(n.ctx(), &tasksapi.ListTasksRequest{})
	if err != nil {
		n.t.Fatal(err)
	}
	return resp.Tasks
}

// task returns the container's task as containerd sees it.
func (n *node) task(id string) *tasktypes.Process {
	n.t.Helper()
	resp, err := client.TaskService().Get(n.ctx(), &tasksapi.GetRequest{ContainerID: id})
	if err != nil {
		n.t.Fatalf("task %s: %v", id, errdefs.FromGRPC(err))
	}
	return resp.Process
}

func (n *node) snapshots() []snapshots.Info {
	n.t.Helper()
	var out []snapshots.Info
	err := client.SnapshotService(snapshotter).Walk(n.ctx(), func(_ context.Context, info snapshots.Info) error {
		out = append(out, info)
		return nil
	})
	if err != nil {
		n.t.Fatal(err)
	}
	return out
}

// holderDir is where noderun pins the mount namespace holding its pods' ipc
// and uts namespaces (cni.Holder).
func (n *node) holderDir() string { return filepath.Join(n.run, "ns") }

// heldSandboxes lists the pods whose ipc/uts namespaces noderun holds, seen
// through the thread noderun keeps in the holder.
func (n *node) heldSandboxes() []string {
	n.t.Helper()
	pid := n.proc.Process.Pid
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		n.t.Fatal(err)
	}
	for _, tk := range tasks {
		// Only the holder's thread has a /pods at its root.
		ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task/%s/root/pods", pid, tk.Name()))
		if err == nil {
			names := []string{}
			for _, e := range ents {
				names = append(names, e.Name())
			}
			return names
		}
	}
	n.t.Fatalf("no thread of noderun (pid %d) is in its namespace holder", pid)
	return nil
}

// hostMounts lists the points of the mounts at or below dir ("/" for all)
// that match keep, in mount order.
func hostMounts(t *testing.T, dir string, keep func(testnode.Mount) bool) []string {
	t.Helper()
	ms, err := testnode.MountsUnder(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range ms {
		if keep(m) {
			out = append(out, m.Point)
		}
	}
	return out
}

// mountsUnder lists mount points at or below dir.
func mountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	return hostMounts(t, dir, func(testnode.Mount) bool { return true })
}

// cleanup removes every manifest and lets noderun tear the pods down; what
// noderun leaves (or everything, if it is not running) is removed directly.
func (n *node) cleanup() {
	t := n.t
	ents, _ := os.ReadDir(n.podsDir)
	for _, e := range ents {
		_ = os.Remove(filepath.Join(n.podsDir, e.Name()))
	}
	clean := false
	if n.running() {
		// Real-world manifests keep the default 30 s grace period, often
		// with a PID 1 that ignores SIGTERM: give teardown that and more.
		deadline := time.Now().Add(cleanupTimeout)
		for !clean && time.Now().Before(deadline) {
			var list v1.PodList
			clean = n.get("/pods", &list) == nil && len(list.Items) == 0 && n.countContainers() == 0
			if !clean {
				time.Sleep(pollEvery)
			}
		}
		if !clean {
			t.Logf("cleanup: noderun did not tear the pods down within %s; removing them directly", cleanupTimeout)
		}
		n.stop()
	}
	if !clean {
		n.forceClean()
	}
	// noderun's namespace holder outlives it, as it must.
	if err := testnode.UnmountUnder(n.holderDir()); err != nil {
		t.Errorf("cleanup: %v", err)
	}
	// Like the bridge, the node-wide masquerade outlives noderun (its pods
	// may run on); only reset removes it.
	if err := cni.RemoveMasquerade(context.Background(), n.netName); err != nil {
		t.Error(err)
	}
	if _, err := net.InterfaceByName(n.bridge); err == nil {
		if out, err := exec.Command("ip", "link", "del", n.bridge).CombinedOutput(); err != nil {
			t.Errorf("ip link del %s: %v: %s", n.bridge, err, out)
		}
	}
	if t.Failed() {
		b, _ := os.ReadFile(n.out)
		t.Logf("noderun output (%s):\n%s", n.out, b)
	}
	if err := os.RemoveAll(n.root); err != nil {
		t.Errorf("remove %s: %v", n.root, err)
	}
}

func (n *node) countContainers() int {
	cs, err := client.ContainerService().List(n.ctx())
	if err != nil {
		return -1
	}
	return len(cs)
}

// forceClean removes what noderun would: containers with their tasks and
// snapshots, CNI attachments, pinned namespaces and any other mount left
// under the node's directories.
func (n *node) forceClean() {
	t := n.t
	ctx, cancel := context.WithTimeout(n.ctx(), time.Minute)
	defer cancel()
	if err := testnode.RemoveContainers(ctx, client); err != nil {
		t.Errorf("cleanup: %v", err)
	}
	mgr, err := cni.New(cni.Config{ConfDir: n.cniConf, BinDirs: []string{cniBinDir}, CacheDir: filepath.Join(n.state, "cni", "cache")})
	if err != nil {
		t.Errorf("cleanup: %v", err)
	}
	sandboxes, _ := os.ReadDir(filepath.Join(n.run, "pods"))
	for _, sb := range sandboxes {
		dir := filepath.Join(n.run, "pods", sb.Name())
		if mgr != nil {
			if err := mgr.Del(ctx, cni.Attachment{ID: sb.Name(), NetNS: filepath.Join(dir, "net")}); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
		if err := cni.RemoveNamespaces(dir, nil); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	}
	if err := testnode.UnmountUnder(n.root); err != nil {
		t.Errorf("cleanup: %v", err)
	}
}

// stepContext bounds one command of a test's sequence (cancelled at the
// test's end): a deadline shared by the whole sequence fails it on a busy
// machine, where every step is slower, though no step hangs.
func stepContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitTimeout)
	t.Cleanup(cancel)
	return ctx
}

// runBounded runs c, with its output combined, and expects it to end
// within d. One still running then is a hang to explain: the test logs the
// goroutines of noderun and of c (a Go program sent SIGQUIT prints its own
// and exits) that serve streams, and returns the output from before.
func (n *node) runBounded(c *exec.Cmd, d time.Duration) (string, error) {
	out := &syncBuffer{}
	c.Stdout, c.Stderr = out, out
	if err := c.Start(); err != nil {
		return "", err
	}
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	select {
	case err := <-done:
		return out.String(), err
	case <-time.After(d):
	}
	var daemon string
	if err := n.get("/debug/pprof/goroutine?debug=2", &daemon); err != nil {
		daemon = err.Error()
	}
	before := out.String()
	c.Process.Signal(syscall.SIGQUIT)
	err := <-done
	n.t.Logf("%q still runs after %v; noderun's goroutines that serve it:\n%s\n\nits own:\n%s",
		c.Args, d, goroutinesWith(daemon, "StreamServer)", "remoteStreams)", "Runtime).Exec", "spdystream", "containerd/cio", "containerd/fifo"),
		goroutinesWith(strings.TrimPrefix(out.String(), before), "noderun/noderun/", "spdystream"))
	return before, err
}

// goroutinesWith are the goroutines of a dump that mention one of marks,
// without the idle workers of SPDY connections.
func goroutinesWith(dump string, marks ...string) string {
	var keep []string
	for _, g := range strings.Split(dump, "\n\n") {
		idle := strings.Contains(g, "FrameQueue).Pop") || strings.Contains(g, "Serve.func1") || strings.Contains(g, "pprof")
		if !idle && slices.ContainsFunc(marks, func(m string) bool { return strings.Contains(g, m) }) {
			keep = append(keep, g)
		}
	}
	return strings.Join(keep, "\n\n")
}
