package main

import (
	"log/slog"

	"github.com/noderun/noderun/kubeapi"
	"github.com/noderun/noderun/runner"
	ctrdrt "github.com/noderun/noderun/runner/containerd"
	"github.com/noderun/noderun/runner/sandbox"
)

// kubeStreams serves pods' logs, exec, attach and port-forward for the
// Kubernetes API from the engine's status, the pod logs, the runtime and
// the pods' pinned network namespaces.
func kubeStreams(engine *runner.Engine, rt *ctrdrt.Runtime, pods *sandbox.Pods, podLogDir string, log *slog.Logger) *kubeapi.StreamServer {
	return kubeapi.NewStreamServer(kubeapi.StreamConfig{
		Pods:         engine.Pods,
		Changes:      engine.Changes,
		PodLogDir:    podLogDir,
		Exec:         rt.Exec,
		Attach:       rt.Attach,
		AttachOutput: rt.AttachOutput,
		DialPod:      pods.DialPod,
		Log:          log,
	})
}
