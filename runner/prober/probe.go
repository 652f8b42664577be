// Package prober makes the kubelet's container probes and lifecycle hooks:
// httpGet, tcpSocket and grpc from noderun's own process, exec through an
// Execer (the container runtime), and one worker per probe that runs it on
// the kubelet's schedule and keeps its result per container run.
//
// The kubelet sources this follows are pkg/probe/{http,tcp,grpc,exec},
// pkg/kubelet/prober (prober.go, worker.go, prober_manager.go) and
// pkg/kubelet/lifecycle/handlers.go; messages use the kubelet's words since
// they end up in the same events.
package prober

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/noderun/noderun/internal/expansion"
)

// Result is what one probe attempt concluded.
type Result int

const (
	Unknown Result = iota
	Success
	Failure
)

func (r Result) String() string {
	switch r {
	case Success:
		return "Success"
	case Failure:
		return "Failure"
	}
	return "Unknown"
}

// Execer runs a command in a container and waits for it; with timeout > 0
// the process is killed then and timedOut is set. output is stdout then
// stderr. noderun passes its Runtime.ExecSync.
type Execer func(ctx context.Context, containerID string, cmd []string, timeout time.Duration) (output []byte, exitCode int, timedOut bool, err error)

// Target is the container run a probe or hook is aimed at.
type Target struct {
	PodIP       string        // host for httpGet, tcpSocket and grpc unless the handler names one
	ContainerID string        // for exec
	Container   *v1.Container // for named ports and $(VAR) in exec probes
}

// version is the Kubernetes release whose kubelet noderun answers as, in
// the User-Agent of probes (kube-probe/1.37) and HTTP hooks.
const version = "1.37"

// maxOutput is how much of an HTTP body or an exec probe's output the
// kubelet keeps (10 KiB).
const maxOutput = 10 << 10

// execGrace is how long past its timeout an exec probe may take to be
// killed and reaped before the attempt is given up: the runtime's kill at
// the timeout decides, not a race with this context.
const execGrace = 10 * time.Second

// Do runs one attempt of h with timeout, as the kubelet's probers make
// it. The message is the kubelet's: for a Failure it is what follows
// "<Kind> probe failed: " in the Unhealthy event. An error means the
// attempt could not be made at all (a port name the container lacks, a
// runtime that cannot exec); the kubelet records it and keeps the previous
// result. The result is then Unknown.
func Do(ctx context.Context, h *v1.ProbeHandler, timeout time.Duration, t Target, exec Execer) (Result, string, error) {
	if h.Exec != nil {
		ctx, cancel := context.WithTimeout(ctx, timeout+execGrace)
		defer cancel()
		return doExec(ctx, h.Exec.Command, timeout, t, exec)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	switch {
	case h.HTTPGet != nil:
		return doHTTP(ctx, h.HTTPGet, t)
	case h.TCPSocket != nil:
		return doTCP(ctx, h.TCPSocket, t)
	case h.GRPC != nil:
		return doGRPC(ctx, h.GRPC, timeout, t)
	}
	return Unknown, "", fmt.Errorf("missing probe handler for container %q", containerName(t.Container))
}

// doExec is the kubelet's exec prober: exit 0 succeeds, any other exit
// fails with the command's output as the message, a timeout fails with
// the CRI client's words, and a command that could not run is an error.
func doExec(ctx context.Context, cmd []string, timeout time.Duration, t Target, exec Execer) (Result, string, error) {
	cmd = expandStatic(cmd, t.Container)
	out, code, timedOut, err := exec(ctx, t.ContainerID, cmd, timeout)
	switch {
	case timedOut:
		return Failure, fmt.Sprintf("command timed out: %q timed out after %s", strings.Join(cmd, " "), timeout), nil
	case err != nil:
		return Unknown, "", err
	}
	if len(out) > maxOutput {
		out = out[:maxOutput]
	}
	if code != 0 {
		return Failure, string(out), nil
	}
	return Success, string(out), nil
}

// expandStatic replaces $(VAR) in an exec probe's command from the
// container's env as written (the kubelet's ExpandContainerCommandOnlyStatic):
// a variable set from valueFrom counts as empty, and nothing else (pod IP,
// the image's env) is known.
func expandStatic(cmd []string, c *v1.Container) []string {
	if c == nil || len(c.Env) == 0 {
		return cmd
	}
	lookup := func(name string) (string, bool) {
		// The last definition wins, as in the kubelet's map.
		for i := len(c.Env) - 1; i >= 0; i-- {
			if c.Env[i].Name == name {
				return c.Env[i].Value, true
			}
		}
		return "", false
	}
	out := make([]string, len(cmd))
	for i, s := range cmd {
		out[i] = expansion.Expand(s, lookup)
	}
	return out
}

// doTCP is the kubelet's tcp prober: success once a connection is made.
func doTCP(ctx context.Context, h *v1.TCPSocketAction, t Target) (Result, string, error) {
	port, err := resolvePort(h.Port, t.Container)
	if err != nil {
		return Unknown, "", err
	}
	host := h.Host
	if host == "" {
		host = t.PodIP
	}
	conn, err := probeDialer.DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return Failure, err.Error(), nil
	}
	conn.Close()
	return Success, "", nil
}

// probeDialer makes every probe connection. A connection that carries one
// request never needs TCP keep-alive, which would cost three setsockopt
// calls per probe.
var probeDialer = net.Dialer{KeepAlive: -1}

// resolvePort is the kubelet's ResolveContainerPort: a number, or a name
// from the container's ports, or failing that a number written as a string.
func resolvePort(p intstr.IntOrString, c *v1.Container) (int, error) {
	port := -1
	switch p.Type {
	case intstr.Int:
		port = p.IntValue()
	case intstr.String:
		found := false
		if c != nil {
			for _, cp := range c.Ports {
				if cp.Name == p.StrVal {
					port, found = int(cp.ContainerPort), true
					break
				}
			}
		}
		if !found {
			n, err := strconv.Atoi(p.StrVal)
			if err != nil {
				return -1, err
			}
			port = n
		}
	default:
		return -1, fmt.Errorf("intOrString had no kind: %+v", p)
	}
	if port > 0 && port < 65536 {
		return port, nil
	}
	return port, fmt.Errorf("invalid port number: %v", port)
}

func containerName(c *v1.Container) string {
	if c == nil {
		return ""
	}
	return c.Name
}
