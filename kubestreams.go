package main

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"sync/atomic"

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

// engineStreams hands the API's streaming requests to the StreamServer
// once the engine runs; the API refuses requests (503) until then.
type engineStreams struct {
	s atomic.Pointer[kubeapi.StreamServer]
}

var _ kubeapi.Streams = (*engineStreams)(nil)

func (e *engineStreams) set(s *kubeapi.StreamServer) { e.s.Store(s) }

// get is the StreamServer, or nil after answering 503.
func (e *engineStreams) get(w http.ResponseWriter) *kubeapi.StreamServer {
	s := e.s.Load()
	if s == nil {
		http.Error(w, "noderun is starting", http.StatusServiceUnavailable)
	}
	return s
}

func (e *engineStreams) Log(w http.ResponseWriter, r *http.Request, ns, pod string) {
	if s := e.get(w); s != nil {
		s.Log(w, r, ns, pod)
	}
}

func (e *engineStreams) Exec(w http.ResponseWriter, r *http.Request, ns, pod string) {
	if s := e.get(w); s != nil {
		s.Exec(w, r, ns, pod)
	}
}

func (e *engineStreams) Attach(w http.ResponseWriter, r *http.Request, ns, pod string) {
	if s := e.get(w); s != nil {
		s.Attach(w, r, ns, pod)
	}
}

func (e *engineStreams) PortForward(w http.ResponseWriter, r *http.Request, ns, pod string) {
	if s := e.get(w); s != nil {
		s.PortForward(w, r, ns, pod)
	}
}
