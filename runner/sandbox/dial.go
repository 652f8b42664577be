package sandbox

import (
	"context"
	"net"
	"path/filepath"

	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/cni"
	"github.com/noderun/noderun/runner"
)

// DialPod connects to port on the pod's loopback, for port-forward: in the
// network namespace pinned in its sandbox, or the host's for a hostNetwork
// pod.
func (p *Pods) DialPod(ctx context.Context, pod *v1.Pod, port int) (net.Conn, error) {
	if pod.Spec.HostNetwork {
		return cni.DialLoopback(ctx, "", port)
	}
	sb := runner.Sandbox{Dir: filepath.Join(p.dir, runner.SandboxID(string(pod.UID)))}
	return cni.DialLoopback(ctx, sb.NetNSPath(), port)
}
