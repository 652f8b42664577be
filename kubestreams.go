package main

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"

	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/cni"
	"github.com/noderun/noderun/kubeapi"
	"github.com/noderun/noderun/runner"
	ctrdrt "github.com/noderun/noderun/runner/containerd"
)

// kubeStreams serves pods' logs, exec, attach and port-forward for the
// Kubernetes API from the engine's status, the pod logs, the runtime and
// the pods' pinned network namespaces.
func kubeStreams(engine *runner.Engine, rt *ctrdrt.Runtime, podLogDir, runDir string, log *slog.Logger) *kubeapi.StreamServer {
	return kubeapi.NewStreamServer(kubeapi.StreamConfig{
		Pods:      engine.Pods,
		Changes:   engine.Changes,
		PodLogDir: podLogDir,
		Exec:      rt.Exec,
		DialPod: func(ctx context.Context, pod *v1.Pod, port int) (net.Conn, error) {
			if pod.Spec.HostNetwork {
				return cni.DialLoopback(ctx, "", port)
			}
			sb := runner.Sandbox{Dir: filepath.Join(runDir, "pods", runner.SandboxID(string(pod.UID)))}
			return cni.DialLoopback(ctx, sb.NetNSPath(), port)
		},
		Log: log,
	})
}
