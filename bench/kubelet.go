package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/containerd"
	tasksapi "github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/namespaces"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/noderun/noderun/internal/ociimage"
	"github.com/noderun/noderun/internal/testnode"
	ctrdrt "github.com/noderun/noderun/runner/containerd"
)

const (
	// kubeVersion is the kubelet the peers bench builds: the newest
	// release whose module the Go proxy serves with all its staging
	// modules at the matching v0.X.Y.
	kubeVersion = "v1.34.2"
	// pauseRef is the sandbox image the kubelet's containerd runs for
	// every pod, packed locally from busybox (no registry is reachable).
	pauseRef     = "registry.k8s.io/pause:3.10"
	criNS        = "k8s.io" // the CRI plugin's containerd namespace
	kubeNodeName = "nrbench"
)

// kubelet is the kubelet in standalone static-pod mode on a private
// containerd with its CRI plugin and the bench's CNI chain on a bridge of
// its own: no API server, pods from its staticPodPath.
type kubelet struct {
	dir, manifests, cgroupRoot string
	readOnly                   int // port of the read-only API (/pods)
	ctrd, proc                 *testnode.Process
	client                     *containerd.Client
	socket, subnet             string
	args                       []string // the kubelet's command line, to start it again
}

// startKubelet builds (or finds cached) the kubelet, starts its
// containerd and then the kubelet, and returns once /pods answers.
func startKubelet(ctx context.Context, e *env, bridge, subnet string) (k *kubelet, retErr error) {
	bin, err := testnode.BuildKube(ctx, kubeVersion, "kubelet")
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(e.dir, "kubelet")
	k = &kubelet{dir: dir, manifests: filepath.Join(dir, "manifests"), cgroupRoot: "/nrbench-kube-" + filepath.Base(e.dir),
		socket: filepath.Join(dir, "c.sock"), subnet: subnet}
	defer func() {
		if retErr != nil {
			retErr = errors.Join(retErr, k.close())
		}
	}()
	if err := e.runState(filepath.Join(dir, "state")); err != nil {
		return k, err
	}
	if err := os.MkdirAll(k.manifests, 0o755); err != nil {
		return k, err
	}
	cniDir := filepath.Join(dir, "cni")
	if err := writeCNIConfig(filepath.Join(cniDir, "10-nrbench.conflist"), bridge, subnet, filepath.Join(dir, "cni-cache")); err != nil {
		return k, err
	}
	conf := filepath.Join(dir, "containerd.toml")
	if err := os.WriteFile(conf, criConfig(dir, k.socket, cniDir), 0o644); err != nil {
		return k, err
	}
	if k.ctrd, err = testnode.Start(exec.Command("containerd", "--config", conf), filepath.Join(dir, "containerd.log"), true); err != nil {
		return k, err
	}
	if err := k.connect(ctx); err != nil {
		return k, err
	}
	if err := k.importImages(ctx, e); err != nil {
		return k, err
	}
	for _, m := range cgroupMounts() {
		if err := os.MkdirAll(filepath.Join(m, k.cgroupRoot), 0o755); err != nil {
			return k, err
		}
	}
	if k.readOnly, err = freePort(); err != nil {
		return k, err
	}
	port, err := freePort()
	if err != nil {
		return k, err
	}
	cfg := filepath.Join(dir, "kubelet.json")
	if err := os.WriteFile(cfg, kubeletConfig(k, port), 0o644); err != nil {
		return k, err
	}
	k.args = []string{filepath.Join(bin, "kubelet"), "--config", cfg, "--root-dir", filepath.Join(dir, "root"),
		"--cert-dir", filepath.Join(dir, "pki"), "--hostname-override", kubeNodeName, "--v", "1"}
	return k, k.start(ctx, true)
}

// start starts the kubelet process and returns once /pods answers;
// truncate starts its log afresh.
func (k *kubelet) start(ctx context.Context, truncate bool) error {
	log := filepath.Join(k.dir, "kubelet.log")
	var err error
	if k.proc, err = testnode.Start(exec.Command(k.args[0], k.args[1:]...), log, truncate); err != nil {
		return err
	}
	for deadline := time.Now().Add(2 * time.Minute); ; {
		if _, err := k.pods(ctx); err == nil {
			return nil
		} else if !k.proc.Running() || time.Now().After(deadline) {
			return fmt.Errorf("kubelet did not serve /pods: %w; see %s", err, log)
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
}

// criConfig is a containerd config with the CRI plugin on: its own
// root, state and socket, overlayfs, runc v2 with cgroupfs, the sandbox
// image packed locally and the CNI config dir of the kubelet's bridge.
// OOM scores are kept at or above containerd's own: the bench may lack
// CAP_SYS_RESOURCE (as in a container), and the kubelet asks -998 for
// every sandbox.
func criConfig(dir, socket, cniDir string) []byte {
	return fmt.Appendf(nil, `version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = %q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), socket, pauseRef, testnode.CNIBinDir, cniDir)
}

// kubeletConfig is a KubeletConfiguration for standalone static pods:
// anonymous, AlwaysAllow, cgroupfs under a root of the bench's own, no
// swap check, no eviction or image GC (the machine's disk is shared), the
// read-only port on loopback for /pods.
func kubeletConfig(k *kubelet, port int) []byte {
	b, _ := json.Marshal(map[string]any{
		"apiVersion":                  "kubelet.config.k8s.io/v1beta1",
		"kind":                        "KubeletConfiguration",
		"staticPodPath":               k.manifests,
		"fileCheckFrequency":          "20s",
		"containerRuntimeEndpoint":    "unix://" + k.socket,
		"cgroupDriver":                "cgroupfs",
		"cgroupRoot":                  k.cgroupRoot,
		"failSwapOn":                  false,
		"address":                     "127.0.0.1",
		"port":                        port,
		"readOnlyPort":                k.readOnly,
		"healthzPort":                 0,
		"authentication":              map[string]any{"anonymous": map[string]any{"enabled": true}, "webhook": map[string]any{"enabled": false}},
		"authorization":               map[string]any{"mode": "AlwaysAllow"},
		"evictionHard":                map[string]string{"memory.available": "1Mi"},
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
		"enforceNodeAllocatable":      []string{},
		"resolvConf":                  "",
		"serializeImagePulls":         false,
	})
	return b
}

func (k *kubelet) connect(ctx context.Context) error {
	for deadline := time.Now().Add(time.Minute); ; {
		c, err := containerd.New(k.socket, containerd.WithTimeout(time.Second))
		if err == nil {
			if _, err = c.Version(ctx); err == nil {
				k.client = c
				return nil
			}
			c.Close()
		}
		if time.Now().After(deadline) || !k.ctrd.Running() {
			return fmt.Errorf("kubelet's containerd: %w; see %s", err, filepath.Join(k.dir, "containerd.log"))
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
}

// importImages imports the bench's busybox and the pause image made
// from it into the CRI namespace.
func (k *kubelet) importImages(ctx context.Context, e *env) error {
	ctx = namespaces.WithNamespace(ctx, criNS)
	if _, err := ctrdrt.ImportArchive(ctx, k.client, e.imageTar, snapshotter); err != nil {
		return err
	}
	tar, err := pauseImage(filepath.Join(k.dir, "pause.tar"))
	if err != nil {
		return err
	}
	_, err = ctrdrt.ImportArchive(ctx, k.client, tar, snapshotter)
	return err
}

// pauseImage writes the sandbox image: busybox sleeping until killed.
func pauseImage(path string) (string, error) {
	img, err := ociimage.Busybox(pauseRef)
	if err != nil {
		return "", err
	}
	img.Cmd = []string{"sleep", "infinity"}
	return path, ociimage.WriteFile(path, img)
}

// freePort returns a loopback port nothing listens on now.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// pods reads the kubelet's own API: /pods on its read-only port, the
// static pods with the status its status manager holds.
func (k *kubelet) pods(ctx context.Context) ([]v1.Pod, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(k.readOnly)+"/pods", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /pods: %s", resp.Status)
	}
	var list v1.PodList
	return list.Items, json.NewDecoder(resp.Body).Decode(&list)
}

// writePods writes the static pods (the spec noderun gets, shaped by
// spec if set, the image never pulled) and returns when the first one
// was renamed into place.
func (k *kubelet) writePods(names []string, spec func(*v1.PodSpec)) (time.Time, error) {
	return placeManifests(k.manifests, names, func(name string) ([]byte, error) { return podJSON(name, spec), nil })
}

// podJSON is the bench's one-container pod, shaped by spec if set.
func podJSON(name string, spec func(*v1.PodSpec)) []byte {
	grace := int64(10)
	s := v1.PodSpec{
		TerminationGracePeriodSeconds: &grace,
		Containers:                    []v1.Container{{Name: "main", Image: imageRef, Command: podCommand}},
	}
	if spec != nil {
		spec(&s)
	}
	for _, cs := range [][]v1.Container{s.InitContainers, s.Containers} {
		for i := range cs {
			cs[i].ImagePullPolicy = v1.PullNever
		}
	}
	b, _ := json.Marshal(v1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec:       s,
	})
	return b
}

// waitPods polls /pods until every named pod is Running and Ready (want)
// or none of them is listed (!want), and returns when it saw that.
func (k *kubelet) waitPods(ctx context.Context, names []string, want bool) (time.Time, error) {
	deadline := time.Now().Add(waitTimeout)
	for {
		pods, err := k.pods(ctx)
		at := time.Now()
		if err != nil {
			return at, err
		}
		byName := map[string]*v1.Pod{}
		for i := range pods {
			byName[pods[i].Name] = &pods[i]
		}
		done := true
		for _, n := range names {
			p, ok := byName[n+"-"+kubeNodeName]
			if want && (!ok || !runningReady(p)) || !want && ok {
				done = false
				break
			}
		}
		if done {
			return at, nil
		}
		if at.After(deadline) {
			return at, fmt.Errorf("kubelet: pods not %s after %s", map[bool]string{true: "Ready", false: "gone"}[want], waitTimeout)
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return at, err
		}
	}
}

// tasks counts the tasks (sandboxes and containers) left in the CRI
// namespace.
func (k *kubelet) tasks(ctx context.Context) (int, error) {
	ts, err := k.client.TaskService().List(namespaces.WithNamespace(ctx, criNS), &tasksapi.ListTasksRequest{})
	if err != nil {
		return 0, err
	}
	return len(ts.Tasks), nil
}

// removePods removes the pods' manifests and returns when the kubelet
// no longer lists them and no task is left in its containerd.
func (k *kubelet) removePods(ctx context.Context, names []string) (time.Duration, error) {
	t0 := time.Now()
	for _, name := range names {
		if err := os.Remove(filepath.Join(k.manifests, manifestFile(name))); err != nil {
			return 0, err
		}
	}
	if _, err := k.waitPods(ctx, names, false); err != nil {
		return 0, err
	}
	for deadline := time.Now().Add(waitTimeout); ; {
		n, err := k.tasks(ctx)
		if err != nil {
			return 0, err
		}
		if n == 0 {
			return time.Since(t0), nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("kubelet: %d tasks left %s after removal", n, waitTimeout)
		}
		if err := sleep(ctx, pollEvery); err != nil {
			return 0, err
		}
	}
}

// close removes the pods through the kubelet (so the CRI plugin runs CNI
// DEL and removes the pods' network namespaces), stops it and its
// containerd by PID, and removes what they left: containers, the cgroup
// root, the bridge.
func (k *kubelet) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTime)
	defer cancel()
	var errs []error
	if k.proc != nil && k.proc.Running() {
		ents, _ := os.ReadDir(k.manifests)
		var names []string
		for _, e := range ents {
			if name, ok := strings.CutSuffix(e.Name(), ".json"); ok && !strings.HasPrefix(name, ".") {
				names = append(names, name)
			}
		}
		if len(names) > 0 {
			_, err := k.removePods(ctx, names)
			errs = append(errs, err)
		}
		k.proc.Stop(20 * time.Second)
	}
	if k.client != nil {
		ctx := namespaces.WithNamespace(ctx, criNS)
		// The sandboxes' masquerade rules too: the CRI plugin removes them
		// only with the sandbox, at the kubelet's garbage collection.
		errs = append(errs, k.removeNetNS(ctx), clearNAT(k.subnet), testnode.RemoveContainers(ctx, k.client), k.client.Close())
	}
	if k.ctrd != nil {
		k.ctrd.Stop(20 * time.Second)
	}
	for _, m := range cgroupMounts() {
		removeTree(filepath.Join(m, k.cgroupRoot))
	}
	return errors.Join(errs...)
}

// removeNetNS unpins and removes the network namespaces the CRI plugin
// made for the sandboxes, in the host's /var/run/netns: containerd 1.6
// removes one only with its sandbox, which the kubelet's garbage
// collection does a while after the pod went, not at its removal.
func (k *kubelet) removeNetNS(ctx context.Context) error {
	cs, err := k.client.Containers(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, c := range cs {
		spec, err := c.Spec(ctx)
		if err != nil || spec.Linux == nil {
			continue
		}
		for _, ns := range spec.Linux.Namespaces {
			if ns.Type != specs.NetworkNamespace || !strings.HasPrefix(ns.Path, "/var/run/netns/") && !strings.HasPrefix(ns.Path, "/run/netns/") {
				continue
			}
			_ = unix.Unmount(ns.Path, unix.MNT_DETACH)
			if err := os.Remove(ns.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// cgroupMounts are the mount points of every cgroup hierarchy.
func cgroupMounts() []string {
	ms, _ := testnode.MountsUnder("/")
	var out []string
	for _, m := range ms {
		if m.FSType == "cgroup" || m.FSType == "cgroup2" {
			out = append(out, m.Point)
		}
	}
	return out
}

// removeTree removes an (empty) cgroup and its children, deepest first.
func removeTree(dir string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.IsDir() {
			removeTree(filepath.Join(dir, e.Name()))
		}
	}
	_ = unix.Rmdir(dir)
}
