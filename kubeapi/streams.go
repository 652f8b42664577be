package kubeapi

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/noderun/noderun/internal/execio"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// StreamConfig is what the streaming endpoints (pods/log, exec, attach,
// portforward) need from noderun.
type StreamConfig struct {
	// Pods returns the pods with their status (the engine's Pods).
	Pods func() []v1.Pod
	// Changes returns a channel closed once pod statuses change (the
	// engine's Changes); a follow learns so that its container ended.
	Changes func() (version uint64, changed <-chan struct{})
	// PodLogDir holds the container logs:
	// <dir>/<namespace>_<name>_<uid>/<container>/<restart>.log.
	PodLogDir string
	// Exec runs a command in a running container with the client's
	// streams and returns its exit code (the runtime's Exec).
	Exec func(ctx context.Context, containerID string, cmd []string, s execio.ExecIO) (int, error)
	// Attach connects an attach session's stdin and terminal sizes to a
	// running container (the runtime's Attach). Nil: attach only shows the
	// output.
	Attach func(ctx context.Context, containerID string, stdinOnce bool, s execio.ExecIO) error
	// AttachOutput writes a running container's output as it comes (the
	// runtime's AttachOutput); with crilog.ErrNotCollected, or nil, an
	// attach reads the output from the log.
	AttachOutput func(ctx context.Context, containerID string, stdout, stderr io.Writer) error
	// DialPod connects to port on the loopback of the pod's network (the
	// host's for a hostNetwork pod).
	DialPod func(ctx context.Context, pod *v1.Pod, port int) (net.Conn, error)
	Log     *slog.Logger
}

// StreamServer serves the streaming subresources of pods.
type StreamServer struct {
	cfg          StreamConfig
	writeTimeout time.Duration // for each write of a log
}

var _ Streams = (*StreamServer)(nil)

// NewStreamServer returns the streaming endpoints over cfg.
func NewStreamServer(cfg StreamConfig) *StreamServer {
	return &StreamServer{cfg: cfg, writeTimeout: writeTimeout}
}

const (
	// streamIdleTimeout is the kubelet's default streamingConnectionIdleTimeout.
	streamIdleTimeout = 4 * time.Hour
	// streamCreationTimeout bounds the wait for a client's streams
	// (the kubelet's DefaultStreamCreationTimeout).
	streamCreationTimeout = 30 * time.Second
)

// pod finds a pod by namespace and name.
func (s *StreamServer) pod(namespace, name string) (*v1.Pod, *metav1.Status) {
	for _, p := range s.cfg.Pods() {
		if p.Namespace == namespace && p.Name == name {
			return &p, nil
		}
	}
	return nil, notFound("pods", name)
}

// findContainer is the named container of pod and its status, or the only
// one when name is empty, as the API server chooses.
func findContainer(pod *v1.Pod, name string) (*v1.Container, *v1.ContainerStatus, *metav1.Status) {
	all := slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers)
	if name == "" {
		if len(pod.Spec.Containers) != 1 || len(pod.Spec.InitContainers) != 0 {
			names := make([]string, len(all))
			for i, c := range all {
				names[i] = c.Name
			}
			return nil, nil, badRequest(fmt.Sprintf("a container name must be specified for pod %s, choose one of: %v", pod.Name, names))
		}
		name = pod.Spec.Containers[0].Name
	}
	for i := range pod.Spec.EphemeralContainers {
		all = append(all, v1.Container(pod.Spec.EphemeralContainers[i].EphemeralContainerCommon))
	}
	i := slices.IndexFunc(all, func(c v1.Container) bool { return c.Name == name })
	if i < 0 {
		return nil, nil, badRequest(fmt.Sprintf("container %s is not valid for pod %s", name, pod.Name))
	}
	statuses := slices.Concat(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses, pod.Status.EphemeralContainerStatuses)
	j := slices.IndexFunc(statuses, func(st v1.ContainerStatus) bool { return st.Name == name })
	if j < 0 {
		return &all[i], &v1.ContainerStatus{Name: name}, nil
	}
	return &all[i], &statuses[j], nil
}

// runningContainer is the ID of the named container's running run; verb
// says what the client asked ("exec into", "attach to"), notRunning how a
// container that does not run is answered.
func (s *StreamServer) runningContainer(namespace, podName, name, verb string, notRunning func(container string) *metav1.Status) (pod *v1.Pod, container string, id string, _ *metav1.Status) {
	pod, serr := s.pod(namespace, podName)
	if serr != nil {
		return nil, "", "", serr
	}
	if pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed {
		return nil, "", "", badRequest(fmt.Sprintf("cannot %s a container in a completed pod; current phase is %s", verb, pod.Status.Phase))
	}
	c, st, serr := findContainer(pod, name)
	if serr != nil {
		return nil, "", "", serr
	}
	if st.State.Running == nil {
		return nil, "", "", notRunning(c.Name)
	}
	return pod, c.Name, runtimeID(st.ContainerID), nil
}

// runtimeID strips the runtime's scheme from a status's containerID.
func runtimeID(containerID string) string {
	if _, id, ok := strings.Cut(containerID, "://"); ok {
		return id
	}
	return containerID
}

// ended is closed once the container run id of the pod no longer runs.
// It wakes on the engine's status changes only, never on a timer.
func (s *StreamServer) ended(ctx context.Context, namespace, podName, name, id string) <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		for {
			_, changed := s.cfg.Changes() // before the look: no change is missed
			if !s.running(namespace, podName, name, id) {
				close(ch)
				return
			}
			select {
			case <-changed:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch
}

func (s *StreamServer) running(namespace, podName, name, id string) bool {
	pod, serr := s.pod(namespace, podName)
	if serr != nil {
		return false
	}
	_, st, serr := findContainer(pod, name)
	return serr == nil && st.State.Running != nil && runtimeID(st.ContainerID) == id
}

// logPath is where a run of a container logs, as the runner names it.
func (s *StreamServer) logPath(pod *v1.Pod, name string, restart int32) string {
	dir := fmt.Sprintf("%s_%s_%s", pod.Namespace, pod.Name, pod.UID)
	return filepath.Join(s.cfg.PodLogDir, dir, name, strconv.Itoa(int(restart))+".log")
}
