package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/noderun/noderun/cni"
	"github.com/noderun/noderun/crilog"
	"github.com/noderun/noderun/internal/logdriver"
	"github.com/noderun/noderun/internal/memtrim"
	"github.com/noderun/noderun/kubeapi"
	"github.com/noderun/noderun/runner"
	ctrdrt "github.com/noderun/noderun/runner/containerd"
	"github.com/noderun/noderun/runner/containerd/daemon"
	"github.com/noderun/noderun/runner/sandbox"
)

// node is what runs pods on a connected containerd: the runtime, the
// sandboxes, the engine over both and the containers' log collector.
type node struct {
	rt     *ctrdrt.Runtime
	net    *sandbox.Pods
	engine *runner.Engine
	logs   *crilog.Holder
	holder *cni.Holder
}

// newRuntime is the runtime as run and reset both build it; run adds what
// starting containers needs (opts).
func newRuntime(cfg hostConfig, conn *daemon.Conn, driver string, opts ...ctrdrt.Option) *ctrdrt.Runtime {
	base := []ctrdrt.Option{ctrdrt.WithSnapshotter(snapshotter), ctrdrt.WithLogger(cfg.log), ctrdrt.WithCgroups(cfg.cgroups)}
	return ctrdrt.New(conn.Client, cfg.namespace, cfg.layout.Runc(), driver, append(base, opts...)...)
}

// newSandboxes is the pods' sandboxes on the CNI config of cfg; holder is
// nil for reset (which unpins the namespaces' holder with the run dir) and
// watch the dirs whose changes make the node look at its pods' networks.
func newSandboxes(cfg hostConfig, holder *cni.Holder, watch []string) (*sandbox.Pods, error) {
	cniMgr, err := cni.New(cfg.cni)
	if err != nil {
		return nil, err
	}
	return sandbox.New(cniMgr, cfg.layout.Sandboxes(), holder, sandbox.WithLogger(cfg.log), sandbox.WithConfigDirs(watch...)), nil
}

// newNode builds and starts the node's parts on conn: the log collector,
// the runtime, the sandboxes and the engine (not yet running).
func newNode(ctx context.Context, cfg nodeConfig, conn *daemon.Conn, ledger *ctrdrt.ImportLedger, metrics *kubeapi.Metrics) (*node, error) {
	log, l := cfg.log, cfg.layout
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find own binary for the log driver: %w", err)
	}
	n := &node{logs: crilog.NewHolder(l.CollectorSocket(), startCollector(exe, l.CollectorSocket()), log)}
	go n.logs.Run(ctx)
	ctrdrt.WarnPIDReuse(log, "/proc/sys/kernel/pid_max")
	if warnings, err := ctrdrt.UseTempMountDir(l.TmpMounts()); err != nil {
		return nil, fmt.Errorf("temporary mounts: %w", err)
	} else if len(warnings) > 0 {
		log.Warn("temporary mounts left by an earlier run not all removed", "err", errors.Join(warnings...))
	}
	n.rt = newRuntime(cfg.hostConfig, conn, logdriver.InstallOrSelf(log, l.DriverBin(), exe),
		ctrdrt.WithAddress(conn.Address), ctrdrt.WithSeccompDir(l.Seccomp()), ctrdrt.WithPullFallback(cfg.pullFallback), ctrdrt.WithShimGroups(cfg.shimGroups),
		ctrdrt.WithRegistry(cfg.registry), ctrdrt.WithImportLedger(ledger), ctrdrt.WithLogRotation(cfg.rotation),
		ctrdrt.WithLogCollector(l.CollectorSocket()), ctrdrt.WithPodLogDir(l.PodLogs))
	n.rt.StockCreateLeases()
	trim := memtrim.New()
	go trim.Run(ctx)
	if n.holder, err = cni.OpenHolder(l.NSHolder()); err != nil {
		return nil, err
	}
	if n.net, err = newSandboxes(cfg.hostConfig, n.holder, append([]string{cfg.cni.ConfDir}, cfg.cni.BinDirs...)); err != nil {
		n.holder.Close()
		return nil, err
	}
	metrics.LogStreams(n.logs.Streams)
	ecfg := cfg.engine
	ecfg.NSHolder, ecfg.OnActivity = n.holder.Root(), trim.Activity
	ecfg.OnProbeResult = func(ns, pod, uid, container, probeType, result string) {
		metrics.ProbeResult(probeType, result, container, pod, ns, uid)
	}
	ecfg.Metrics = metrics
	ecfg.RecursiveReadOnlyMounts = n.rt.RecursiveReadOnlyMounts()
	var why string
	ecfg.UserNamespaces, why = n.rt.UserNamespaces()
	log.Info("pod user namespaces (hostUsers: false)", "supported", ecfg.UserNamespaces, "why", why)
	n.engine = runner.New(ecfg, n.rt, n.net)
	go n.net.Watch(ctx, n.engine.NetworkChanged)
	return n, nil
}

func (n *node) close() { n.holder.Close() }
