package main

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/clock"

	"github.com/noderun/noderun/internal/apipods"
	"github.com/noderun/noderun/kubeapi"
	"github.com/noderun/noderun/manifests"
	"github.com/noderun/noderun/mirror"
	"github.com/noderun/noderun/runner"
	ctrdrt "github.com/noderun/noderun/runner/containerd"
	"github.com/noderun/noderun/runner/containerd/daemon"
	"github.com/noderun/noderun/systemd"
)

const (
	defaultRelist = 20 * time.Second
	snapshotter   = "overlayfs"
)

// runNode is noderun's main mode: every flag checked, the APIs up, then
// containerd, the node's parts and its sources, until a signal arrives.
// Pods keep running when noderun stops; a restart adopts them.
func runNode(c *cli.Context) error {
	cfg, err := nodeConfigFrom(c) // every flag read and checked; nothing started yet
	if err != nil {
		return err
	}
	ctx, log := c.Context, cfg.log
	// Before anything that touches the status socket, containerd or pods.
	release, err := cfg.layout.Lock()
	if err != nil {
		return err
	}
	defer release()
	apis, err := serveAPIs(cfg) // 503 with what start-up waits for, until ready
	if err != nil {
		return err
	}
	defer apis.close()
	startCtx, started := context.WithCancel(ctx)
	defer started()
	go systemd.HoldStart(startCtx, log)
	conn, err := connect(ctx, cfg, apis, startCtx)
	if err != nil || conn == nil {
		return err // nil: stopped while waiting
	}
	defer conn.Client.Close()
	go conn.Supervise(ctx)
	ledger, err := prepareContainerd(ctx, cfg, conn) // stray shims, leftover leases, the images dir
	if err != nil {
		return err
	}
	n, err := newNode(ctx, cfg, conn, ledger, apis.kube.Metrics())
	if err != nil {
		return err
	}
	defer n.close()
	debugPods, err := apipods.New(cfg.nodeName, cfg.layout.APIPods(), n.engine, clock.RealClock{}, log)
	if err != nil {
		return err
	}
	go systemd.Announce(ctx, sdEngine{n.engine}, log, func() {
		started()
		log.Info("ready", "node", cfg.nodeName, "sources", cfg.nSources())
	})
	backend := apis.ready(cfg, n, conn, debugPods)
	go systemd.WatchShutdown(ctx, cfg.shutdown, n.engine)
	if cfg.kubeconfig != "" {
		go startMirror(cfg, backend, apis.kube.Metrics()).Run(ctx)
	}
	err = n.engine.Run(ctx, startSources(ctx, cfg, debugPods), cfg.nSources()+1) // and the API's pods
	_, _ = systemd.Stopping()
	// The cause names the signal: a stop nobody asked for says what came.
	log.Info("stopping; pods keep running", "cause", context.Cause(ctx))
	return err
}

// apis are the node's status socket and Kubernetes API, served from before
// containerd answers: until ready they answer 503 and what start-up waits
// for.
type apis struct {
	status  *kubeapi.StatusServer
	kube    *kubeapi.Server
	healthz *kubeapi.Healthz // nil: --healthz-port 0
	close   func()
}

func serveAPIs(cfg nodeConfig) (*apis, error) {
	status, closeStatus, err := kubeapi.ServeStatus(cfg.layout.Socket, cfg.log)
	if err != nil {
		return nil, err
	}
	kubeapi.RouteKlog(cfg.log)
	kube, closeKube, err := startKubeAPI(cfg.api, cfg.layout, cfg.log)
	if err != nil {
		closeStatus()
		return nil, err
	}
	a := &apis{status: status, kube: kube, close: func() {
		closeKube()
		closeStatus()
	}}
	if cfg.healthz.port == 0 {
		return a, nil
	}
	healthz, closeHealthz, err := kubeapi.ServeHealthz(cfg.healthz.address, cfg.healthz.port, cfg.log)
	if err != nil {
		a.close()
		return nil, err
	}
	closeOthers := a.close
	a.healthz, a.close = healthz, func() {
		closeHealthz()
		closeOthers()
	}
	return a, nil
}

// setWaiting says, on both APIs and systemd's status line, what start-up
// waits for.
func (a *apis) setWaiting(msg string) {
	a.status.SetWaiting(msg)
	a.kube.SetWaiting(msg)
	_, _ = systemd.Status(msg)
}

// ready hands the engine, the runtime's streams and the log collector's
// counts to both APIs, and returns what they read.
func (a *apis) ready(cfg nodeConfig, n *node, conn *daemon.Conn, debugPods *apipods.Source) apiBackend {
	backend := apiBackend{Engine: n.engine, logs: n.logs, debugPods: debugPods, node: &kubeapi.NodeReporter{
		Name: cfg.nodeName, HostIP: cfg.hostIP, Labels: cfg.labels, Version: version, StorageDir: cfg.layout.PodLogs, Started: time.Now(),
		RuntimeVersion: func(ctx context.Context) (string, error) {
			v, err := conn.Client.Version(ctx)
			return v.Version, err
		},
		Healthy: func(ctx context.Context) error { return readyErrors(n.engine.Healthy(ctx), n.engine.ShutdownStatus()) },
	}}
	a.status.Ready(backend)
	if a.healthz != nil {
		a.healthz.Ready(n.engine.LoopHealthy)
	}
	a.kube.ServeUsage(podUsage(n.engine, n.rt, cfg))
	a.kube.Ready(backend, kubeStreams(n.engine, n.rt, n.net, cfg.layout.PodLogs, cfg.log))
	return backend
}

// startMirror makes mirror mode's loop: it reads the node and its pods as
// the local API does, and reports each call to /metrics and each failed
// one as an event on the node.
func startMirror(cfg nodeConfig, backend apiBackend, metrics *kubeapi.Metrics) *mirror.Mirror {
	return mirror.New(mirror.Config{
		Kubeconfig: cfg.kubeconfig, NodeName: cfg.nodeName, Source: backend, Log: cfg.log, KubeletVersion: kubeapi.KubeletVersion(),
		OnResult: func(op string, err error) {
			metrics.MirrorCall(op, err)
			if err != nil {
				backend.NodeEvent(v1.EventTypeWarning, "FailedMirror", op+": "+err.Error())
			}
		},
	})
}

// connect waits for the chosen containerd; until start-up is done
// (startCtx), each failed try is what the APIs say start-up waits for.
// nil, nil: ctx ended while waiting.
func connect(ctx context.Context, cfg nodeConfig, apis *apis, startCtx context.Context) (*daemon.Conn, error) {
	dcfg := cfg.daemon
	dcfg.OnWait = func(err error) {
		if startCtx.Err() == nil { // once ready, /healthz and the log report an outage
			apis.setWaiting("waiting for containerd: " + err.Error())
		}
	}
	conn, err := daemon.Connect(ctx, dcfg)
	if err != nil && ctx.Err() != nil {
		return nil, nil
	}
	return conn, err
}

// prepareContainerd cleans up after an earlier run and imports the images
// dir, before any create, pull or import of this one: the lock keeps the
// namespace to us.
func prepareContainerd(ctx context.Context, cfg nodeConfig, conn *daemon.Conn) (*ctrdrt.ImportLedger, error) {
	log := cfg.log
	// A noderun killed while a task was deleted can leave its shim running.
	reapCtx, reaped := context.WithTimeout(ctx, 30*time.Second) // a stalled shim must not hold the start
	n, err := ctrdrt.ReapStrayShims(reapCtx, conn.Client, conn.Address, cfg.namespace, log)
	reaped()
	if err != nil {
		log.Warn("stray shims not looked for", "err", err)
	} else if n > 0 {
		log.Info("ended shims left serving no task by an earlier run", "count", n)
	}
	// What a killed noderun was doing holds leases (and snapshots,
	// content) for a day otherwise.
	if n, err := ctrdrt.ReleaseLeftoverLeases(ctx, conn.Client); err != nil {
		log.Warn("leftover leases not released", "err", err)
	} else if n > 0 {
		log.Info("released leases left by an earlier run", "count", n)
	}
	// Imported before the first reconcile so offline pods never try a pull.
	ledger := ctrdrt.OpenImportLedger(cfg.layout.ImportLedger())
	return ledger, ctrdrt.ImportImagesDir(ctx, conn.Client, cfg.layout.Images, snapshotter, ledger, log)
}

// sdEngine is the engine as systemd sees it: the status line is the pod
// counts.
type sdEngine struct{ *runner.Engine }

func (e sdEngine) Status() string { return e.PodCounts().String() }

// startSources starts every manifest source and the API-made pods' one,
// sending to the channel the engine reads.
func startSources(ctx context.Context, cfg nodeConfig, apiPods *apipods.Source) <-chan manifests.Snapshot {
	snaps := make(chan manifests.Snapshot)
	go apiPods.Run(ctx, snaps)
	for _, p := range cfg.files {
		src := manifests.NewFileSource(p, cfg.nodeName, append(slices.Clip(cfg.fileOpts),
			manifests.WithRelistInterval(cfg.fileCheck), manifests.WithLogger(cfg.log))...)
		go func() {
			if err := src.Run(ctx, snaps); err != nil && ctx.Err() == nil {
				cfg.log.Error("manifest source stopped", "path", p, "err", err)
			}
		}()
	}
	for _, src := range cfg.urls {
		go func() { _ = src.Run(ctx, snaps) }() // returns only when ctx ends
	}
	return snaps
}

// readyErrors is the node's Ready message from what keeps it from being
// Ready, as the kubelet's aggregate writes it: one error alone, several
// as [a, b].
func readyErrors(errs ...error) error {
	var msgs []string
	var last error
	for _, err := range errs {
		if err != nil {
			msgs, last = append(msgs, err.Error()), err
		}
	}
	if len(msgs) < 2 {
		return last
	}
	return errors.New("[" + strings.Join(msgs, ", ") + "]")
}
