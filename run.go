package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/containerd"
	"github.com/urfave/cli/v2"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/noderun/noderun/cni"
	"github.com/noderun/noderun/crilog"
	"github.com/noderun/noderun/internal/cgroups"
	"github.com/noderun/noderun/internal/kernel"
	"github.com/noderun/noderun/internal/logdriver"
	"github.com/noderun/noderun/kubeapi"
	"github.com/noderun/noderun/manifests"
	"github.com/noderun/noderun/runner"
	ctrdrt "github.com/noderun/noderun/runner/containerd"
	"github.com/noderun/noderun/runner/containerd/daemon"
	"github.com/noderun/noderun/systemd"
)

const (
	defaultRelist = 20 * time.Second
	snapshotter   = "overlayfs"
)

// runNode is noderun's main mode: connect, import images, start the sources
// and the engine, serve the status API until a signal arrives. Pods keep
// running when noderun stops; a restart adopts them.
func runNode(c *cli.Context) error {
	log, err := newLogger(c)
	if err != nil {
		return err
	}
	if err := kernel.Check(kernel.Release()); errors.Is(err, kernel.ErrUnknown) {
		log.Warn("kernel version not checked", "err", err, "minimum", kernel.Minimum.String())
	} else if err != nil {
		return err
	}
	ctx := c.Context
	paths := uniq(c.StringSlice("manifests"))
	if err := resolveDirs(c, true); err != nil {
		return err
	}
	stateDir, runDir := c.String("state-dir"), c.String("run-dir")
	nodeName := c.String("node-name")
	// Built first, so a bad flag fails before anything starts.
	urlSources, err := newURLSources(c, nodeName, filepath.Join(stateDir, "sources"), log)
	if err != nil {
		return err
	}
	nSources := len(paths) + len(urlSources)
	if nSources == 0 {
		return errors.New("no manifests: give --manifests DIR|FILE or --manifest-url URL (or NODERUN_MANIFESTS)")
	}
	// Before anything that touches the status socket, containerd or pods.
	release, err := lockDirs(stateDir, runDir)
	if err != nil {
		return err
	}
	defer release()
	// The status API answers from here on, so that /healthz tells what
	// startup waits for.
	api, closeAPI, err := kubeapi.ServeStatus(statusSocket(c), log)
	if err != nil {
		return err
	}
	defer closeAPI()
	// The API answers 503 until the engine and runtime are there (Ready).
	kubeapi.RouteKlog(log)
	kube, closeKube, err := startKubeAPI(c, log)
	if err != nil {
		return err
	}
	defer closeKube()

	// READY=1 waits for containerd and the first reconcile, which may take
	// longer than systemd's start timeout.
	startCtx, started := context.WithCancel(ctx)
	defer started()
	go func() {
		if err := systemd.ExtendStartup(startCtx, 20*time.Second, time.Minute); err != nil {
			log.Warn("sd_notify", "err", err)
		}
	}()

	dcfg := daemonConfig(c, log)
	dcfg.OnWait = func(err error) {
		if startCtx.Err() != nil {
			return // ready: /healthz and the log report a later outage
		}
		msg := "waiting for containerd: " + err.Error()
		api.SetWaiting(msg)
		kube.SetWaiting(msg)
		_, _ = systemd.Status(msg)
	}
	conn, err := daemon.Connect(ctx, dcfg)
	if err != nil && ctx.Err() != nil {
		return nil // stopped while waiting
	}
	if err != nil {
		return err
	}
	defer conn.Client.Close()
	go conn.Supervise(ctx)
	client := conn.Client
	// Before anything else in the namespace, which the lock keeps to us: a
	// noderun killed while a task was deleted can leave its shim running.
	reapCtx, reaped := context.WithTimeout(ctx, 30*time.Second) // a stalled shim must not hold the start
	n, err := ctrdrt.ReapStrayShims(reapCtx, client, conn.Address, c.String("containerd-namespace"), log)
	reaped()
	if err != nil {
		log.Warn("stray shims not looked for", "err", err)
	} else if n > 0 {
		log.Info("killed shims left serving no task by an earlier run", "count", n)
	}
	// Before any create, pull or import: what a killed noderun was doing
	// holds leases (and snapshots, content) for a day otherwise.
	if n, err := ctrdrt.ReleaseLeftoverLeases(ctx, client); err != nil {
		log.Warn("leftover leases not released", "err", err)
	} else if n > 0 {
		log.Info("released leases left by an earlier run", "count", n)
	}

	imagesDir := c.String("images-dir")
	if imagesDir == "" {
		imagesDir = filepath.Join(stateDir, "images")
	}
	// Imported before the first reconcile so offline pods never try a pull.
	ledger := ctrdrt.OpenImportLedger(filepath.Join(stateDir, "image-imports.json"))
	if err := importImages(ctx, client, imagesDir, ledger, log); err != nil {
		return err
	}

	cniMgr, err := cni.New(cni.Config{
		ConfDir: c.String("cni-conf-dir"), BinDirs: filepath.SplitList(c.String("cni-bin-dir")),
		CacheDir: filepath.Join(stateDir, "cni", "cache"), DefaultSubnet: c.String("pod-cidr"),
		DefaultBridge: c.String("pod-bridge"), Logger: log,
	})
	if err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own binary for the log driver: %w", err)
	}
	fallback, err := pullFallback(c.String("image-pull-fallback"))
	if err != nil {
		return err
	}
	gcPolicy, err := imageGCPolicy(c)
	if err != nil {
		return err
	}
	rotation, err := logRotation(c)
	if err != nil {
		return err
	}
	cg, err := cgroupLayout(c)
	if err != nil {
		return err
	}
	logSock := collectorSocket(runDir)
	logs := crilog.NewHolder(logSock, startCollector(exe, logSock), log)
	go logs.Run(ctx)
	warnPIDReuse(log, "/proc/sys/kernel/pid_max")
	if warnings, err := ctrdrt.UseTempMountDir(filepath.Join(runDir, "tmpmounts")); err != nil {
		return fmt.Errorf("temporary mounts: %w", err)
	} else if len(warnings) > 0 {
		log.Warn("temporary mounts left by an earlier run not all removed", "err", errors.Join(warnings...))
	}
	rt := ctrdrt.New(client, c.String("containerd-namespace"), filepath.Join(runDir, "runc"), installLogDriver(log, logdriver.Install, stateDir, exe),
		ctrdrt.WithAddress(conn.Address), ctrdrt.WithSnapshotter(snapshotter), ctrdrt.WithLogger(log), ctrdrt.WithSeccompDir(filepath.Join(stateDir, "seccomp")),
		ctrdrt.WithPullFallback(fallback), ctrdrt.WithRegistry(registryConfig(c, stateDir)), ctrdrt.WithImportLedger(ledger),
		ctrdrt.WithLogRotation(rotation), ctrdrt.WithLogCollector(logSock), ctrdrt.WithCgroups(cg),
		ctrdrt.WithPodLogDir(c.String("pod-log-dir")))
	rt.StockCreateLeases()

	relax := newRelaxer()
	go relax.run(ctx)
	holder, err := cni.OpenHolder(filepath.Join(runDir, "ns"))
	if err != nil {
		return err
	}
	defer holder.Close()
	net := newNetwork(cniMgr, filepath.Join(runDir, "pods"), holder,
		append([]string{c.String("cni-conf-dir")}, filepath.SplitList(c.String("cni-bin-dir"))...), log)
	hostIP := c.String("node-ip")
	if hostIP == "" {
		hostIP = defaultHostIP()
	}
	metrics := kube.Metrics()
	metrics.LogStreams(logs.Streams)
	var engine *runner.Engine
	engine = runner.New(runner.Config{
		NodeName: nodeName, HostIP: hostIP, StateDir: stateDir, RunDir: runDir, NSHolder: holder.Root(), PodTmpfs: true,
		PodLogDir: c.String("pod-log-dir"), ResolvConf: c.String("resolv-conf"), Logger: log, Cgroups: cg,
		NetworkCheck:         c.Duration("network-check-interval"),
		AllowedUnsafeSysctls: c.StringSlice("allowed-unsafe-sysctls"),
		ImageGC:              gcPolicy,
		ImageGCPeriod:        c.Duration("image-gc-period"),
		OnActivity:           relax.activity,
		OnProbeResult: func(ns, pod, uid, container, probeType, result string) {
			metrics.ProbeResult(probeType, result, container, pod, ns, uid)
		},
		Metrics: metrics,
		OnReady: func() {
			started()
			log.Info("ready", "node", nodeName, "sources", nSources)
			if _, err := systemd.Ready(); err != nil {
				log.Warn("sd_notify", "err", err)
			}
			go watchdog(ctx, engine, log)
			go podStatus(ctx, engine, log)
		},
	}, rt, net)
	net.changed = engine.NetworkChanged
	go net.watch(ctx)

	snaps := make(chan manifests.Snapshot)
	for _, p := range paths {
		src := manifests.NewFileSource(p, nodeName,
			manifests.WithRelistInterval(c.Duration("file-check-interval")), manifests.WithLogger(log))
		go func() {
			if err := src.Run(ctx, snaps); err != nil && ctx.Err() == nil {
				log.Error("manifest source stopped", "path", p, "err", err)
			}
		}()
	}
	for _, src := range urlSources {
		go func() { _ = src.Run(ctx, snaps) }() // returns only when ctx ends
	}

	backend := apiBackend{Engine: engine, logs: logs, node: &kubeapi.NodeReporter{
		Name: nodeName, HostIP: hostIP, Version: version, StorageDir: c.String("pod-log-dir"), Started: time.Now(),
		RuntimeVersion: func(ctx context.Context) (string, error) {
			v, err := client.Version(ctx)
			return v.Version, err
		},
		Healthy: engine.Healthy,
	}}
	api.Ready(backend)
	kube.Ready(backend, kubeStreams(engine, rt, c.String("pod-log-dir"), runDir, log))
	err = engine.Run(ctx, snaps, nSources)
	_, _ = systemd.Stopping()
	// The cause names the signal: a stop nobody asked for says what came.
	log.Info("stopping; pods keep running", "cause", context.Cause(ctx))
	return err
}

// watchdog feeds systemd's watchdog while the sync loop turns. A containerd
// outage does not stop it: restarting noderun would not end one.
func watchdog(ctx context.Context, engine *runner.Engine, log *slog.Logger) {
	err := systemd.Watchdog(ctx, engine.LoopHealthy, func(err error) {
		log.Warn("not feeding the systemd watchdog", "err", err)
	})
	if err != nil {
		log.Warn("sd_notify watchdog", "err", err)
	}
}

// podStatus keeps systemd's status line (systemctl status) at the pod
// counts, sent when they change.
func podStatus(ctx context.Context, engine *runner.Engine, log *slog.Logger) {
	last := ""
	for {
		if s := engine.PodCounts().String(); s != last {
			if _, err := systemd.Status(s); err != nil {
				log.Warn("sd_notify status", "err", err)
			}
			last = s
		}
		select {
		case <-ctx.Done():
			return
		case <-engine.CountsChanged():
		}
	}
}

func daemonConfig(c *cli.Context, log *slog.Logger) daemon.Config {
	return daemon.Config{
		Address: c.String("containerd-address"), Managed: c.Bool("containerd-managed"),
		StateDir: c.String("state-dir"), RunDir: c.String("run-dir"),
		Namespace: c.String("containerd-namespace"), Logger: log,
	}
}

// importImages imports the tarballs present now, then keeps watching the
// directory for new ones.
func importImages(ctx context.Context, client *containerd.Client, dir string, ledger *ctrdrt.ImportLedger, log *slog.Logger) error {
	watch, err := ctrdrt.WatchImagesDir(ctx, client, dir, snapshotter, ledger, log)
	if err != nil {
		return err
	}
	go func() {
		if err := watch(); err != nil {
			log.Error("images dir watch stopped", "dir", dir, "err", err)
		}
	}()
	return nil
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
func registryConfig(c *cli.Context, stateDir string) ctrdrt.RegistryConfig {
	auth := c.StringSlice("registry-auth-file")
	if len(auth) == 0 {
		auth = []string{filepath.Join(stateDir, "config.json"), "/root/.docker/config.json"}
	}
	return ctrdrt.RegistryConfig{
		ConfigDir:       c.String("registry-config-dir"),
		AuthFiles:       auth,
		ProgressTimeout: c.Duration("image-pull-progress-timeout"),
	}
}

// cgroupLayout reads --cgroup-driver; the hierarchy is the host's.
func cgroupLayout(c *cli.Context) (cgroups.Layout, error) {
	d, err := cgroups.ParseDriver(c.String("cgroup-driver"))
	return cgroups.Detect(d), err
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

// warnPIDReuse warns when an exited log driver's PID may be reused before
// an old shim signals it (ShimSignalsByPID): systemd raises kernel.pid_max
// to 4194304 at boot, other inits leave the kernel's 32768.
func warnPIDReuse(log *slog.Logger, pidMaxFile string) {
	const enough = 1 << 22
	b, err := os.ReadFile(pidMaxFile)
	if err != nil {
		return
	}
	if max, err := strconv.Atoi(strings.TrimSpace(string(b))); err != nil || max >= enough {
		return
	}
	if path, goVersion, byPID := ctrdrt.ShimSignalsByPID(); byPID {
		log.Warn("the containerd shim signals exited log drivers by PID, and PIDs wrap soon: "+
			"a deleted container's SIGTERM may reach an unrelated process; set kernel.pid_max to 4194304",
			"shim", path, "go", goVersion, "pid_max", strings.TrimSpace(string(b)))
	}
}

// installLogDriver returns the program containerd's shim runs as each
// container's log driver: the small one this binary embeds, put in
// <state-dir>/bin by install (logdriver.Install), else noderun's own
// binary (built without it, or the installed copy does not run).
func installLogDriver(log *slog.Logger, install func(dir string) (string, error), stateDir, self string) string {
	path, err := install(filepath.Join(stateDir, "bin"))
	if err != nil {
		log.Warn("noderun's own binary runs as the containers' log driver", "err", err)
	}
	if path == "" {
		return self
	}
	log.Debug("containers' log driver", "path", path)
	// Reading the embedded copy made those pages of the binary resident.
	trimExecutable()
	return path
}
