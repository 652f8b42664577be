package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/urfave/cli/v2"
	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/crilog"
	"github.com/noderun/noderun/internal/apipods"
	"github.com/noderun/noderun/internal/atomicfile"
	"github.com/noderun/noderun/internal/layout"
	"github.com/noderun/noderun/internal/nodelog"
	"github.com/noderun/noderun/kubeapi"
	"github.com/noderun/noderun/runner"
)

func apiFlags() []cli.Flag {
	env := func(name string) []string { return []string{"NODERUN_" + name} }
	return []cli.Flag{
		&cli.StringFlag{Name: "api-address", Value: "127.0.0.1", Usage: "address the Kubernetes API (HTTPS, for kubectl) listens on; beyond loopback anyone who reaches it needs only a token", EnvVars: env("API_ADDRESS")},
		&cli.IntFlag{Name: "api-port", Value: kubeapi.DefaultPort, Usage: "port of the Kubernetes API (0: one the kernel picks; `noderun kubeconfig` finds it)", EnvVars: env("API_PORT")},
		&cli.StringFlag{Name: "node-log-dir", Value: nodelog.DefaultDir, Usage: "directory the node log query (GET /api/v1/nodes/<node>/proxy/logs/, admin token) serves files from, as the kubelet serves /var/log", EnvVars: env("NODE_LOG_DIR")},
		&cli.IntFlag{Name: "healthz-port", Usage: "port of the kubelet's plain-HTTP healthz endpoint, for kubeadm (0: off; the kubelet's is 10248)", EnvVars: env("HEALTHZ_PORT")},
		&cli.StringFlag{Name: "kubeconfig", Usage: "mirror mode: a kubeconfig (the kubelet's kubelet.conf) of an API server to register the node in, with a mirror pod per static pod; pods never wait for it (none: no API server)", EnvVars: env("KUBECONFIG")},
		&cli.StringFlag{Name: "healthz-bind-address", Value: "127.0.0.1", Usage: "address the healthz endpoint listens on, as the kubelet's", EnvVars: env("HEALTHZ_BIND_ADDRESS")},
	}
}

// startKubeAPI opens the Kubernetes API's listener and serves it; until the
// engine is handed over (Ready) it answers 503.
func startKubeAPI(cfg apiConfig, dirs layout.Layout, log *slog.Logger) (srv *kubeapi.Server, stop func() error, err error) {
	if !kubeapi.IsLoopback(cfg.address) {
		log.Warn("the Kubernetes API listens beyond loopback; whoever reaches it needs only a token", "address", cfg.address)
	}
	creds, err := kubeapi.LoadCredentials(dirs.APIDir(), kubeapi.Hosts(cfg.address), time.Now())
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes API credentials: %w", err)
	}
	l, err := kubeapi.Listen(cfg.address, cfg.port)
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes API (--api-address, --api-port): %w", err)
	}
	url := kubeapi.ServerURL(l.Addr())
	if err := atomicfile.WriteFile(dirs.APIServerFile(), []byte(url+"\n"), 0o644); err != nil {
		l.Close()
		return nil, nil, err
	}
	srv = kubeapi.New(creds, kubeapi.WithLogger(log), kubeapi.WithVersion(version), kubeapi.WithMetrics(kubeapi.NewMetrics()),
		kubeapi.WithNodeLogs(nodelog.New(cfg.nodeLogDir)))
	log.Info("kubernetes API", "server", url, "kubeconfig", "noderun kubeconfig [--admin]")
	return srv, srv.Serve(l), nil
}

// apiBackend is what the Kubernetes API and the status socket read: the
// engine, the Node object made from the host and the log collector's
// counts.
type apiBackend struct {
	*runner.Engine
	node      *kubeapi.NodeReporter
	logs      *crilog.Holder
	debugPods *apipods.Source
}

func (b apiBackend) Node(ctx context.Context) *v1.Node { return b.node.Node(ctx) }

// UpdateEphemeralContainers makes the engine the API's kubeapi.Debugger.
func (b apiBackend) UpdateEphemeralContainers(namespace, name string, list []v1.EphemeralContainer) (*v1.Pod, []error, error) {
	pod, warnings, err := b.SetEphemeralContainers(namespace, name, list)
	if errors.Is(err, runner.ErrPodNotFound) {
		err = errors.Join(kubeapi.ErrNoPod, err)
	}
	return pod, warnings, err
}

// CreatePod and DeletePod make the API-made pods the API's
// kubeapi.PodMaker.
func (b apiBackend) CreatePod(namespace string, pod *v1.Pod) (*v1.Pod, []error, error) {
	pod, warnings, err := b.debugPods.Create(namespace, pod)
	var refused *apipods.RefusedError
	switch {
	case errors.As(err, &refused):
		err = &kubeapi.RefusedError{Message: refused.Message}
	case errors.Is(err, apipods.ErrExists):
		err = errors.Join(kubeapi.ErrExists, err)
	}
	return pod, warnings, err
}

func (b apiBackend) DeletePod(namespace, name string) (*v1.Pod, error) {
	pod, err := b.debugPods.Delete(namespace, name)
	if errors.Is(err, apipods.ErrNotFound) {
		err = errors.Join(kubeapi.ErrNoPod, err)
	}
	return pod, err
}

func (b apiBackend) LogStreams(ctx context.Context) ([]crilog.StreamStats, error) {
	return b.logs.Streams(ctx)
}
