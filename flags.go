package main

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/noderun/noderun/cni"
	"github.com/noderun/noderun/crilog"
	"github.com/noderun/noderun/internal/admission"
	"github.com/noderun/noderun/internal/cgroups"
	nrcli "github.com/noderun/noderun/internal/cli"
	"github.com/noderun/noderun/internal/kernel"
	"github.com/noderun/noderun/internal/layout"
	"github.com/noderun/noderun/kubeapi"
	"github.com/noderun/noderun/manifests"
	"github.com/noderun/noderun/runner"
	ctrdrt "github.com/noderun/noderun/runner/containerd"
	"github.com/noderun/noderun/runner/containerd/daemon"
	"github.com/noderun/noderun/systemd"
)

func flags() []cli.Flag {
	env := func(name string) []string { return []string{"NODERUN_" + name} }
	return append([]cli.Flag{
		&cli.StringSliceFlag{Name: "manifests", Usage: "directory or file of Pod manifests (repeatable)", EnvVars: env("MANIFESTS")},
		&cli.StringSliceFlag{Name: "manifest-url", Usage: "http(s) URL of Pod manifests, polled (repeatable)", EnvVars: env("MANIFEST_URL")},
		&cli.DurationFlag{Name: "url-check-interval", Value: defaultRelist, Usage: "poll manifest URLs this often", EnvVars: env("URL_CHECK_INTERVAL")},
		&cli.StringFlag{Name: "node-name", Value: nrcli.DefaultNodeName(), DefaultText: "the hostname, lowercased", Usage: "node name; static pods are named <name>-<node-name>", EnvVars: env("NODE_NAME")},
		&cli.StringFlag{Name: "node-labels", Usage: "labels for the node, key=value pairs separated by commas, as the kubelet's --node-labels: beside kubernetes.io/hostname, os and arch; pods' nodeSelector and node affinity are admitted against them", EnvVars: env("NODE_LABELS")},
		&cli.StringFlag{Name: "node-ip", Usage: "the node's IP for status.hostIP (default: the address of the default route's interface)", EnvVars: env("NODE_IP")},
		&cli.StringFlag{Name: "containerd-address", Value: "/run/containerd/containerd.sock", Usage: "the containerd to use; if it does not answer, noderun waits for it", EnvVars: env("CONTAINERD_ADDRESS")},
		&cli.BoolFlag{Name: "containerd-managed", Usage: "run a private containerd under --state-dir and --run-dir instead of using --containerd-address (chosen by itself, once, when no containerd is installed)", EnvVars: env("CONTAINERD_MANAGED")},
		&cli.StringFlag{Name: "containerd-namespace", Value: "noderun", Usage: "containerd namespace for everything noderun creates", EnvVars: env("CONTAINERD_NAMESPACE")},
		&cli.StringFlag{Name: "state-dir", Value: "/var/lib/noderun", Usage: "pod state, volumes, CNI cache, a managed containerd's root", EnvVars: env("STATE_DIR")},
		&cli.StringFlag{Name: "run-dir", Value: "/run/noderun", Usage: "pinned namespaces, runc state, a managed containerd's socket", EnvVars: env("RUN_DIR")},
		&cli.StringFlag{Name: "pod-log-dir", Value: "/var/log/pods", Usage: "container logs", EnvVars: env("POD_LOG_DIR")},
		&cli.StringFlag{Name: "images-dir", Usage: "image tarballs imported at start and when added (default <state-dir>/images)", EnvVars: env("IMAGES_DIR")},
		&cli.StringFlag{Name: "registry-config-dir", Value: "/etc/containerd/certs.d", Usage: "per-registry <host>/hosts.toml (mirrors, TLS, capabilities), as containerd's config_path", EnvVars: env("REGISTRY_CONFIG_DIR")},
		&cli.StringSliceFlag{Name: "registry-auth-file", Usage: "docker config.json with registry credentials; the first that exists is used (default <state-dir>/config.json, /root/.docker/config.json)", EnvVars: env("REGISTRY_AUTH_FILE")},
		&cli.DurationFlag{Name: "image-pull-progress-timeout", Value: time.Minute, Usage: "cancel a pull that received nothing for this long (0: never)", EnvVars: env("IMAGE_PULL_PROGRESS_TIMEOUT")},
		&cli.StringFlag{Name: "container-log-max-size", Value: "10Mi", Usage: "rotate a container's log at this size, as the kubelet's containerLogMaxSize (0: never)", EnvVars: env("CONTAINER_LOG_MAX_SIZE")},
		&cli.IntFlag{Name: "container-log-max-files", Value: 5, Usage: "log files kept per container run, the current one included (at least 2), as the kubelet's containerLogMaxFiles", EnvVars: env("CONTAINER_LOG_MAX_FILES")},
		&cli.IntFlag{Name: "image-gc-high-threshold", Value: 85, Usage: "remove unused images when the image filesystem is this full (percent)", EnvVars: env("IMAGE_GC_HIGH_THRESHOLD")},
		&cli.IntFlag{Name: "image-gc-low-threshold", Value: 80, Usage: "... down to this (percent)", EnvVars: env("IMAGE_GC_LOW_THRESHOLD")},
		&cli.DurationFlag{Name: "image-minimum-gc-age", Value: 2 * time.Minute, Usage: "an image seen for less time is never removed", EnvVars: env("IMAGE_MINIMUM_GC_AGE")},
		&cli.DurationFlag{Name: "image-gc-period", Value: 5 * time.Minute, Usage: "how often image garbage collection looks (0: never)", EnvVars: env("IMAGE_GC_PERIOD")},
		&cli.StringFlag{Name: "image-pull-fallback", Value: "local", Usage: "local: imagePullPolicy Always runs the local copy when the registry cannot be reached or cannot serve (a warning event); never: fail as the kubelet does", EnvVars: env("IMAGE_PULL_FALLBACK")},
		&cli.StringFlag{Name: "cni-conf-dir", Value: "/etc/cni/net.d", Usage: "CNI configs; the lexicographically first *.conflist, *.conf or *.json is used", EnvVars: env("CNI_CONF_DIR")},
		&cli.StringFlag{Name: "cni-bin-dir", Value: "/opt/cni/bin:/usr/lib/cni", Usage: "CNI plugin search path", EnvVars: env("CNI_BIN_DIR")},
		&cli.StringFlag{Name: "pod-cidr", Value: "10.244.77.0/24", Usage: "subnet of the default CNI config, used when --cni-conf-dir has none", EnvVars: env("POD_CIDR")},
		&cli.StringFlag{Name: "cgroup-driver", Value: "cgroupfs", Usage: "cgroupfs or systemd, as the kubelet's cgroupDriver (match containerd's and the host's: systemd on a systemd host)", EnvVars: env("CGROUP_DRIVER")},
		&cli.StringFlag{Name: "cgroup-root", Value: "noderun", Usage: "the cgroup every pod is under, with the QoS parents burstable and besteffort, where the kubelet has kubepods: a name, /NAME with cgroupfs, NAME.slice with systemd", EnvVars: env("CGROUP_ROOT")},
		&cli.IntFlag{Name: "shim-groups", Value: defaultShimGroups, Usage: "how many containerd-shim-runc-v2 processes serve the pods, 1 to 64, each pod's containers in one (a shim's crash or hang takes its pods' containers with it); 0: one per container", EnvVars: env("SHIM_GROUPS")},
		&cli.StringFlag{Name: "pod-bridge", Value: "noderun0", Usage: "bridge of the default CNI config", EnvVars: env("POD_BRIDGE")},
		&cli.StringSliceFlag{Name: "allowed-unsafe-sysctls", Usage: "sysctls pods may set beyond the kubelet's safe set: names or prefixes ending in * (repeatable, comma-separated), as the kubelet's allowedUnsafeSysctls", EnvVars: env("ALLOWED_UNSAFE_SYSCTLS")},
		&cli.StringFlag{Name: "resolv-conf", Value: "/etc/resolv.conf", Usage: "resolv.conf for pods with dnsPolicy Default", EnvVars: env("RESOLV_CONF")},
		&cli.StringFlag{Name: "status-socket", Usage: "status API socket (default <run-dir>/noderun.sock)", EnvVars: env("STATUS_SOCKET")},
		&cli.DurationFlag{Name: "crashloop-max-backoff", Value: runner.MaxCrashLoopMaxBackoff, Usage: "the longest wait between restarts of a crashing container, 1s to 300s, as the kubelet's crashLoopBackOff.maxContainerRestartPeriod (the first wait is 10s, or this if lower)", EnvVars: env("CRASHLOOP_MAX_BACKOFF")},
		&cli.StringFlag{Name: "memory-swap-behavior", Value: runner.NoSwap, Usage: "NoSwap or LimitedSwap, as the kubelet's memorySwap.swapBehavior: NoSwap gives containers no swap where the kernel accounts it; LimitedSwap gives a Burstable pod's containers their memory request's share of the machine's swap, on cgroup v2 only (elsewhere NoSwap, as the kubelet)", EnvVars: env("MEMORY_SWAP_BEHAVIOR")},
		&cli.DurationFlag{Name: "network-check-interval", Value: 30 * time.Minute, Usage: "CNI CHECK each running pod this often (0: only after a restart and when its interfaces vanish)", EnvVars: env("NETWORK_CHECK_INTERVAL")},
		&cli.DurationFlag{Name: "shutdown-grace-period", Usage: "graceful node shutdown, as the kubelet's shutdownGracePeriod: how long a poweroff or reboot is held up (a logind delay lock) while pods stop, critical ones last (0 with the critical period 0: off)", EnvVars: env("SHUTDOWN_GRACE_PERIOD")},
		&cli.DurationFlag{Name: "shutdown-grace-period-critical-pods", Usage: "of --shutdown-grace-period, the part kept for critical pods (system-node-critical, system-cluster-critical, or spec.priority of 2000000000 and more), stopped after the others, as the kubelet's shutdownGracePeriodCriticalPods", EnvVars: env("SHUTDOWN_GRACE_PERIOD_CRITICAL_PODS")},
		&cli.DurationFlag{Name: "file-check-interval", Value: defaultRelist, Usage: "re-list manifest directories this often (a safety net for missed events)", EnvVars: env("FILE_CHECK_INTERVAL")},
		&cli.StringFlag{Name: "log-level", Value: "info", Usage: "debug, info, warn or error", EnvVars: env("LOG_LEVEL")},
		&cli.StringFlag{Name: "log-format", Value: "text", Usage: "text, json or journal (fields of their own); unset, journal when stderr is the journal (JOURNAL_STREAM), else text", EnvVars: env("LOG_FORMAT")},
		nrcli.LocalConfigFlag(),
	}, append(nrcli.URLFlags(), apiFlags()...)...)
}

// hostConfig is what run and reset both read from the flags: where the
// node keeps its things, and the containerd, network and cgroups that
// hold its pods.
type hostConfig struct {
	log       *slog.Logger
	layout    layout.Layout
	nodeName  string
	namespace string // containerd's
	daemon    daemon.Config
	cni       cni.Config
	cgroups   cgroups.Layout
}

// hostConfigFrom reads the flags run and reset share. The dirs are
// resolved last (with create, made): a bad flag fails before any is.
func hostConfigFrom(c *cli.Context, log *slog.Logger, create bool) (hostConfig, error) {
	cg, err := cgroupLayout(c)
	if err != nil {
		return hostConfig{}, err
	}
	l, err := layout.Resolve(layout.Flags{State: c.String("state-dir"), Run: c.String("run-dir"), PodLogs: c.String("pod-log-dir"),
		Socket: c.String("status-socket"), Images: c.String("images-dir")}, create)
	if err != nil {
		return hostConfig{}, err
	}
	d := daemonConfig(c, log)
	d.StateDir, d.RunDir = l.State, l.Run // resolved: a managed containerd keeps its dirs in them
	return hostConfig{
		log: log, layout: l, nodeName: c.String("node-name"), namespace: c.String("containerd-namespace"),
		daemon: d, cgroups: cg,
		cni: cni.Config{
			ConfDir: c.String("cni-conf-dir"), BinDirs: filepath.SplitList(c.String("cni-bin-dir")),
			CacheDir: l.CNICache(), Logger: log,
		},
	}, nil
}

// nodeConfig is every flag of the node, read once and checked, so that a
// bad one fails at once rather than after containerd answers.
type nodeConfig struct {
	hostConfig
	hostIP       string
	files        []string // --manifests, absolute
	fileCheck    time.Duration
	fileOpts     []manifests.FileOption // --local-config-objects
	urls         []*manifests.URLSource
	api          apiConfig
	healthz      apiConfig // port 0: off
	kubeconfig   string    // mirror mode's, absolute; "": off
	pullFallback bool
	shimGroups   int
	registry     ctrdrt.RegistryConfig
	rotation     crilog.Rotation
	labels       map[string]string // the node's, well-known and --node-labels
	engine       runner.Config     // what the flags say; node.go adds the rest
	shutdown     systemd.ShutdownConfig
}

// apiConfig is where the Kubernetes API listens.
type apiConfig struct {
	address    string
	port       int
	nodeLogDir string // the node log query's files
}

// nodeConfigFrom reads and checks every flag of the node; it starts
// nothing, and makes only the node's dirs (hostConfigFrom).
func nodeConfigFrom(c *cli.Context) (nodeConfig, error) {
	log, err := newLogger(c)
	if err != nil {
		return nodeConfig{}, err
	}
	if err := kernel.Check(kernel.Release()); errors.Is(err, kernel.ErrUnknown) {
		log.Warn("kernel version not checked", "err", err, "minimum", kernel.Minimum.String())
	} else if err != nil {
		return nodeConfig{}, err
	}
	cfg := nodeConfig{files: uniq(c.StringSlice("manifests")), fileCheck: c.Duration("file-check-interval"), fileOpts: nrcli.FileOptions(c),
		api: apiConfig{c.String("api-address"), c.Int("api-port"), c.String("node-log-dir")}, hostIP: c.String("node-ip")}
	if cfg.api.port < 0 || cfg.api.port > 65535 {
		return nodeConfig{}, fmt.Errorf("--api-port %d: want 0 to 65535", cfg.api.port)
	}
	cfg.healthz = apiConfig{address: c.String("healthz-bind-address"), port: c.Int("healthz-port")}
	if cfg.healthz.port < 0 || cfg.healthz.port > 65535 {
		return nodeConfig{}, fmt.Errorf("--healthz-port %d: want 1 to 65535, or 0 for none", cfg.healthz.port)
	}
	if k := c.String("kubeconfig"); k != "" {
		// It may not exist yet: kubeadm writes kubelet.conf after the node agent started.
		if cfg.kubeconfig, err = filepath.Abs(k); err != nil {
			return nodeConfig{}, fmt.Errorf("--kubeconfig %s: %w", k, err)
		}
	}
	if cfg.pullFallback, err = pullFallback(c.String("image-pull-fallback")); err != nil {
		return nodeConfig{}, err
	}
	if cfg.shimGroups = c.Int("shim-groups"); cfg.shimGroups < 0 || cfg.shimGroups > maxShimGroups {
		return nodeConfig{}, fmt.Errorf("--shim-groups %d: must be between 0 (one shim per container) and %d", cfg.shimGroups, maxShimGroups)
	}
	if cfg.rotation, err = logRotation(c); err != nil {
		return nodeConfig{}, err
	}
	gc, err := imageGCPolicy(c)
	if err != nil {
		return nodeConfig{}, err
	}
	if cfg.shutdown, err = shutdownConfig(c, log); err != nil {
		return nodeConfig{}, err
	}
	crashMax, err := crashLoopMaxBackoff(c)
	if err != nil {
		return nodeConfig{}, err
	}
	swap := c.String("memory-swap-behavior")
	if swap != "" && swap != runner.NoSwap && swap != runner.LimitedSwap {
		return nodeConfig{}, fmt.Errorf("--memory-swap-behavior %q: must be NoSwap or LimitedSwap, as the kubelet's memorySwap.swapBehavior", swap)
	}
	if cfg.hostConfig, err = hostConfigFrom(c, log, true); err != nil {
		return nodeConfig{}, err
	}
	cfg.cni.DefaultSubnet, cfg.cni.DefaultBridge = c.String("pod-cidr"), c.String("pod-bridge")
	cfg.registry = registryConfig(c, cfg.layout)
	if cfg.urls, err = newURLSources(c, cfg.nodeName, cfg.layout.Sources(), log); err != nil {
		return nodeConfig{}, err
	}
	if cfg.nSources() == 0 {
		return nodeConfig{}, errors.New("no manifests: give --manifests DIR|FILE or --manifest-url URL (or NODERUN_MANIFESTS)")
	}
	if cfg.hostIP == "" {
		cfg.hostIP = defaultHostIP()
	}
	extra, err := admission.ParseNodeLabels(c.String("node-labels"))
	if err != nil {
		return nodeConfig{}, fmt.Errorf("--node-labels: %w", err)
	}
	cfg.labels = admission.NodeLabels(cfg.nodeName, extra)
	capacity, _ := kubeapi.Resources(cfg.layout.PodLogs)
	cfg.engine = runner.Config{
		NodeName: cfg.nodeName, HostIP: cfg.hostIP, StateDir: cfg.layout.State, RunDir: cfg.layout.Run,
		PodTmpfs: true, PodLogDir: cfg.layout.PodLogs, ResolvConf: c.String("resolv-conf"), Logger: log, Cgroups: cfg.cgroups, PodCgroups: true,
		NetworkCheck:         c.Duration("network-check-interval"),
		AllowedUnsafeSysctls: c.StringSlice("allowed-unsafe-sysctls"),
		ImageGC:              gc,
		ImageGCPeriod:        c.Duration("image-gc-period"),
		Node:                 admissionNode(cfg.nodeName, cfg.labels, cfg.layout.PodLogs),
		MemoryCapacity:       capacity.Memory().Value(),
		AppArmor:             admission.HostAppArmor(),
		CrashLoopMaxBackoff:  crashMax,
		SwapBehavior:         swap,
		SwapCapacity:         cgroups.SwapCapacity(),
	}
	return cfg, nil
}

// shutdownConfig reads the graceful node shutdown flags, checked as the
// kubelet checks shutdownGracePeriod and shutdownGracePeriodCriticalPods.
func shutdownConfig(c *cli.Context, log *slog.Logger) (systemd.ShutdownConfig, error) {
	grace, critical := c.Duration("shutdown-grace-period"), c.Duration("shutdown-grace-period-critical-pods")
	switch {
	case grace < 0:
		return systemd.ShutdownConfig{}, fmt.Errorf("--shutdown-grace-period %s: must be 0 or more", grace)
	case critical < 0:
		return systemd.ShutdownConfig{}, fmt.Errorf("--shutdown-grace-period-critical-pods %s: must be 0 or more", critical)
	case critical > grace:
		return systemd.ShutdownConfig{}, fmt.Errorf("--shutdown-grace-period-critical-pods %s: must be at most --shutdown-grace-period %s", critical, grace)
	}
	return systemd.ShutdownConfig{GracePeriod: grace, CriticalPeriod: critical, Logger: log}, nil
}

// crashLoopMaxBackoff is --crashloop-max-backoff, checked as the kubelet
// checks crashLoopBackOff.maxContainerRestartPeriod: 1000 ms to 300000 ms.
func crashLoopMaxBackoff(c *cli.Context) (time.Duration, error) {
	d := c.Duration("crashloop-max-backoff")
	if d.Milliseconds() < runner.MinCrashLoopMaxBackoff.Milliseconds() || d.Milliseconds() > runner.MaxCrashLoopMaxBackoff.Milliseconds() {
		return 0, fmt.Errorf("--crashloop-max-backoff %s: must be between 1s and 300s, as the kubelet's crashLoopBackOff.maxContainerRestartPeriod", d)
	}
	return d, nil
}

// admissionNode is the node as pod admission sees it: its name, labels
// and allocatable resources, as the Node the API shows.
func admissionNode(name string, labels map[string]string, storageDir string) func() *v1.Node {
	return func() *v1.Node {
		_, alloc := kubeapi.Resources(storageDir)
		return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Status: v1.NodeStatus{Allocatable: alloc}}
	}
}

// nSources is how many manifest sources the engine waits for.
func (cfg nodeConfig) nSources() int { return len(cfg.files) + len(cfg.urls) }

func daemonConfig(c *cli.Context, log *slog.Logger) daemon.Config {
	return daemon.Config{
		Address: c.String("containerd-address"), Managed: c.Bool("containerd-managed"),
		StateDir: c.String("state-dir"), RunDir: c.String("run-dir"),
		Namespace: c.String("containerd-namespace"), Logger: log,
	}
}

func uniq(paths []string) []string {
	var out []string
	for _, p := range paths {
		if abs, err := filepath.Abs(p); err == nil {
			p = abs
		}
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// defaultHostIP is the first IPv4 address of the default route's interface,
// read from /proc/net/route; "" when there is no default route.
func defaultHostIP() string {
	f, err := os.Open("/proc/net/route")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 || fields[1] != "00000000" {
			continue
		}
		iface, err := net.InterfaceByName(fields[0])
		if err != nil {
			return ""
		}
		addrs, _ := iface.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
				return ipn.IP.String()
			}
		}
	}
	return ""
}

// defaultShimGroups is --shim-groups' default: at 30 pods 4 shims take
// 16 MiB of PSS where one per container took 75 MiB, and 1 would take 6
// (make bench, issue 40), while a shim's crash or a hung create (the shims
// of containerd 1.6 and 1.7 create one task at a time and hold their
// other calls meanwhile) reaches a quarter of the pods, not all of them.
const defaultShimGroups = 4

// maxShimGroups bounds --shim-groups: past it the saving is gone.
const maxShimGroups = 64

// pullFallback reads --image-pull-fallback.
func pullFallback(v string) (bool, error) {
	switch v {
	case "local":
		return true, nil
	case "never":
		return false, nil
	}
	return false, fmt.Errorf("--image-pull-fallback: %q is neither local nor never", v)
}

// registryConfig reads the registry flags; credentials are looked for as the
// kubelet looks (its root dir, then the user's docker config), in noderun's
// state dir first.
func registryConfig(c *cli.Context, l layout.Layout) ctrdrt.RegistryConfig {
	auth := c.StringSlice("registry-auth-file")
	if len(auth) == 0 {
		auth = []string{l.RegistryAuth(), "/root/.docker/config.json"}
	}
	return ctrdrt.RegistryConfig{
		ConfigDir:       c.String("registry-config-dir"),
		AuthFiles:       auth,
		ProgressTimeout: c.Duration("image-pull-progress-timeout"),
	}
}

// cgroupLayout reads --cgroup-driver and --cgroup-root; the hierarchy is
// the host's.
func cgroupLayout(c *cli.Context) (cgroups.Layout, error) {
	d, err := cgroups.ParseDriver(c.String("cgroup-driver"))
	if err != nil {
		return cgroups.Layout{}, err
	}
	l := cgroups.Detect(d)
	l.Root, err = cgroups.ParseRoot(c.String("cgroup-root"))
	return l, err
}

// logRotation reads the kubelet's containerLogMaxSize and
// containerLogMaxFiles from their flags.
func logRotation(c *cli.Context) (crilog.Rotation, error) {
	q, err := resource.ParseQuantity(c.String("container-log-max-size"))
	if err != nil || q.Sign() < 0 {
		return crilog.Rotation{}, fmt.Errorf("--container-log-max-size %q: want a size such as 10Mi, or 0", c.String("container-log-max-size"))
	}
	files := c.Int("container-log-max-files")
	if files < 2 {
		return crilog.Rotation{}, fmt.Errorf("--container-log-max-files %d: want at least 2 (the current file and one rotated)", files)
	}
	return crilog.Rotation{MaxSize: q.Value(), MaxFiles: files}, nil
}

// imageGCPolicy reads the kubelet-style image GC flags.
func imageGCPolicy(c *cli.Context) (runner.ImageGCPolicy, error) {
	p := runner.ImageGCPolicy{
		HighThresholdPercent: c.Int("image-gc-high-threshold"),
		LowThresholdPercent:  c.Int("image-gc-low-threshold"),
		MinAge:               c.Duration("image-minimum-gc-age"),
	}
	if p.LowThresholdPercent < 0 || p.HighThresholdPercent > 100 || p.LowThresholdPercent > p.HighThresholdPercent {
		return p, fmt.Errorf("--image-gc-low-threshold %d and --image-gc-high-threshold %d: want 0 <= low <= high <= 100",
			p.LowThresholdPercent, p.HighThresholdPercent)
	}
	return p, nil
}
