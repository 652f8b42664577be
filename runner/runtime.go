package runner

import (
	"context"
	"errors"
	"path/filepath"
	"time"

	v1 "k8s.io/api/core/v1"
)

// Runtime is what the sync engine needs from a container runtime. It speaks
// only stdlib and core/v1 types so the engine can be tested without a daemon;
// runner/containerd implements it.
type Runtime interface {
	// EnsureImage makes ref available according to policy and returns the
	// image's own configuration.
	EnsureImage(ctx context.Context, ref string, policy v1.PullPolicy) (ImageConfig, error)
	// ListContainers returns the containers noderun owns, with task state:
	// those of one pod, or all when podUID is empty.
	ListContainers(ctx context.Context, podUID string) ([]ContainerStatus, error)
	// StartContainer creates the container described by cfg and starts its
	// task.
	StartContainer(ctx context.Context, cfg *ContainerConfig) (Started, error)
	// CreateContainer creates the container and its task but does not
	// start it, so that the pod's network can be set up meanwhile. The
	// task is created once ready (when not nil) returned nil: the
	// container's record needs no namespace, its task does; an error
	// from ready removes the container. Until it is started,
	// RemoveContainer discards it.
	CreateContainer(ctx context.Context, cfg *ContainerConfig, ready func() error) (CreatedContainer, error)
	// StopContainer signals the task, waits up to grace, then kills it. A
	// missing container or task is not an error.
	StopContainer(ctx context.Context, id string, grace time.Duration) error
	// RemoveContainer deletes the task, container and snapshot. A missing
	// container is not an error.
	RemoveContainer(ctx context.Context, id string) error
	// Exits streams task-exit events until ctx ends. The channel is closed
	// when the stream breaks; callers resync and subscribe again.
	Exits(ctx context.Context) (<-chan ExitEvent, error)
	// ExecSync runs cmd inside the running container id (its namespaces, cgroup, user, env and
	// working dir, as containerd's CRI ExecSync does) and waits for it. With timeout > 0 the
	// process is killed at the timeout and the result has TimedOut set. Output holds stdout
	// then stderr, each cut at 16 KiB.
	ExecSync(ctx context.Context, id string, cmd []string, timeout time.Duration) (ExecResult, error)
	// Ping reports whether the runtime answers.
	Ping(ctx context.Context) error
	// GCImages removes unused images while the image filesystem is above
	// the policy's high threshold, down to its low one, never one of keep
	// (image references as manifests write them). It returns what it
	// removed.
	GCImages(ctx context.Context, keep []string, p ImageGCPolicy) ([]string, error)
	// MountImageVolume mounts the root filesystem of image ref (which
	// EnsureImage made available) read-only in a directory under dir, one
	// per image and pod, from a snapshot of its own, and returns that
	// directory. Repeating it is harmless.
	MountImageVolume(ctx context.Context, podUID, ref, dir string) (string, error)
	// RemoveImageVolumes removes the pod's image volume snapshots, once
	// nothing mounts them. None is not an error.
	RemoveImageVolumes(ctx context.Context, podUID string) error
}

// CreatedContainer is a container whose task waits to be started.
type CreatedContainer interface {
	// Start starts the task. On error the container is removed.
	Start(ctx context.Context) (Started, error)
}

// Started is a container's start as the runtime recorded it. At is what
// ListContainers reports as the run's CreatedAt from then on, across
// noderun restarts too, so the engine takes its start time from here
// rather than from its own clock: status.startedAt must not move when
// noderun restarts.
type Started struct {
	User *v1.LinuxContainerUser // the user the process runs as, names resolved
	At   time.Time
}

// ImageGCPolicy is the kubelet's image garbage collection policy.
type ImageGCPolicy struct {
	HighThresholdPercent int           // collect when the image filesystem is this full
	LowThresholdPercent  int           // down to this
	MinAge               time.Duration // an image seen for less time stays
}

// ExecResult is how a command run by ExecSync ended.
type ExecResult struct {
	// Output is the command's stdout then its stderr, each cut at 16 KiB.
	Output []byte
	// ExitCode is the process's exit status, 128+signal when a signal
	// ended it (137 after the kill at a timeout); -1 when the process did
	// not die in time after that kill.
	ExitCode int
	// TimedOut says the timeout passed and the process was killed.
	TimedOut bool
}

// Network sets up and tears down a pod's sandbox, which has no pause
// container: its pinned namespaces, its CNI attachment, its /dev/shm and,
// for shareProcessNamespace, the process that holds its PID namespace.
// runner/sandbox implements it on the cni package.
type Network interface {
	// Setup creates (or finds) the pod's namespaces and attaches it to the
	// network unless sb.HostNetwork. It returns the pod's IPs and whether the
	// sandbox is new: containers still running from before it are in a
	// sandbox that no longer exists. Errors wrap ErrNetworkNotReady when
	// the node's network configuration is unusable.
	Setup(ctx context.Context, sb *Sandbox) (ips []string, fresh bool, err error)
	// Pin creates (or finds) the pod's namespaces and /dev/shm without
	// attaching the network, so that containers can be created in them
	// while Setup attaches it. Setup does this too.
	Pin(ctx context.Context, sb *Sandbox) error
	// Teardown detaches and removes everything Setup made; idempotent.
	Teardown(ctx context.Context, sb *Sandbox) error
	// Check reports ErrSandboxBroken when the sandbox's network is gone
	// (e.g. its veth was deleted). deep asks the CNI plugins (CHECK), which
	// is costly; otherwise only cheap local facts are checked.
	Check(ctx context.Context, sb *Sandbox, deep bool) error
	// GC releases network resources (IPs, cached results, host port rules,
	// pinned namespaces) of every sandbox whose ID is not in keep.
	GC(ctx context.Context, keep map[string]bool) error
}

// Sentinel errors a Network wraps.
var (
	ErrNetworkNotReady = errors.New("network not ready")
	ErrSandboxBroken   = errors.New("pod sandbox network broken")
)

// Image errors a Runtime's EnsureImage wraps; their text is the kubelet's
// waiting reason.
var (
	ErrImagePull        = errors.New("ErrImagePull")
	ErrImageNeverPull   = errors.New("ErrImageNeverPull")
	ErrInvalidImageName = errors.New("InvalidImageName")
	// ErrImageImporting: not present yet while the images dir is being
	// imported; the container waits (noderun's own waiting reason).
	ErrImageImporting = errors.New("ImageImporting")
)

// PullTrace is told when the runtime starts pulling an image, so the
// engine can record it (as httptrace does for requests: carried in the
// context, since most EnsureImage calls pull nothing).
type PullTrace struct {
	Start func(ref string)
}

type pullTraceKey struct{}

// WithPullTrace returns ctx carrying t.
func WithPullTrace(ctx context.Context, t *PullTrace) context.Context {
	return context.WithValue(ctx, pullTraceKey{}, t)
}

// PullStarted tells ctx's PullTrace, if any, that ref is being pulled.
func PullStarted(ctx context.Context, ref string) {
	if t, _ := ctx.Value(pullTraceKey{}).(*PullTrace); t != nil && t.Start != nil {
		t.Start(ref)
	}
}

// ErrContainerConfig is wrapped by a Runtime's StartContainer when the
// manifest asks for something the node cannot give (a missing seccomp
// profile, AppArmor on a host without it): the kubelet reports these as
// CreateContainerConfigError, not as a runtime failure.
var ErrContainerConfig = errors.New("container config")

// ImageConfig is the part of an OCI image config that Kubernetes merges with
// the container spec.
type ImageConfig struct {
	Ref        string // normalized name, e.g. docker.io/library/busybox:1.36
	ID         string // repo digest, e.g. docker.io/library/busybox@sha256:…
	Entrypoint []string
	Cmd        []string
	Env        []string
	WorkingDir string
	User       string
	StopSignal string
	// PullFallback is set when a pull the policy asked for could not
	// reach the registry and the local copy is used instead: why.
	PullFallback string
	// Size is the image's size in the content store (its layers).
	Size int64
}

// Sandbox describes a pod's shared namespaces, all pinned under Dir.
type Sandbox struct {
	ID          string // stable sandbox id, also CNI's container id
	PodUID      string
	PodName     string
	Namespace   string
	Hostname    string
	HostNetwork bool
	HostPID     bool   // the host's PID namespace
	HostIPC     bool   // the host's IPC namespace and /dev/shm
	SharePID    bool   // shareProcessNamespace: one PID namespace for the pod
	Dir         string // run-dir directory holding the pinned namespace files
	// UserNS is the pod's user namespace mapping (hostUsers: false), nil
	// for the host's user namespace; the namespace is pinned at UserNSPath.
	UserNS *IDMapping
	// NSHolder is where the pod's ipc and uts namespace files are, seen
	// from the host: <NSHolder>/<Dir's name>/ipc; "" puts them in Dir.
	NSHolder string
	Epoch    string // names this incarnation of the sandbox; containers carry it
	Ports    []PortMapping
	// From the kubernetes.io/ingress-bandwidth and egress-bandwidth annotations.
	IngressBandwidth, EgressBandwidth string
	DNS                               DNSConfig // the pod's resolver settings, for CNI's dns capability
}

// DNSConfig is what a pod's resolv.conf holds.
type DNSConfig struct {
	Servers, Searches, Options []string
}

// PortMapping is a container's hostPort, for CNI's portmap plugin.
type PortMapping struct {
	HostPort, ContainerPort int
	Protocol, HostIP        string
}

// Paths of the pod's namespace files.
func (s *Sandbox) NetNSPath() string  { return s.Dir + "/net" }
func (s *Sandbox) UserNSPath() string { return s.Dir + "/user" }
func (s *Sandbox) IPCNSPath() string  { return s.heldNSDir() + "/ipc" }
func (s *Sandbox) UTSNSPath() string  { return s.heldNSDir() + "/uts" }

func (s *Sandbox) heldNSDir() string {
	if s.NSHolder == "" {
		return s.Dir
	}
	return filepath.Join(s.NSHolder, filepath.Base(s.Dir))
}

// PIDNSPath is the pinned PID namespace of a pod that shares one.
func (s *Sandbox) PIDNSPath() string { return s.Dir + "/pid" }

// ShmPath is the pod's /dev/shm, a tmpfs its containers share (what the
// pause container's /dev/shm is under CRI).
func (s *Sandbox) ShmPath() string { return s.Dir + "/shm" }

// Mount is a resolved volume mount for one container.
type Mount struct {
	Source      string
	Destination string
	ReadOnly    bool
	// Propagation is the volumeMount's mountPropagation; empty is None.
	Propagation v1.MountPropagationMode
	// RecursiveReadOnly makes the mounts below Source read-only too.
	RecursiveReadOnly bool
}

// ContainerConfig is everything the runtime needs to create one container;
// the engine has already resolved the Kubernetes semantics.
type ContainerConfig struct {
	ID           string
	Pod          *v1.Pod
	Container    *v1.Container
	Init         bool
	Image        ImageConfig
	Args         []string // final process args (entrypoint/cmd merged)
	Env          []string // final KEY=value list
	User         ProcessUser
	WorkingDir   string
	Mounts       []Mount
	Sandbox      *Sandbox
	CgroupParent string // per-pod cgroup parent, e.g. /noderun/pod<uid>
	Resources    Resources
	OOMScoreAdj  int // from the pod's QoS class; the runtime clamps it to its own
	LogPath      string
	RestartCount int
	SpecHash     string
	LastState    *v1.ContainerStateTerminated // previous run, kept in labels
	// TargetPID is the process whose PID namespace an ephemeral container
	// with a targetContainerName joins (0: none).
	TargetPID uint32
}

// ProcessUser is who a container runs as, decided as the kubelet decides it;
// the runtime resolves names and groups in the image's /etc/passwd and
// /etc/group, as containerd's CRI plugin does.
type ProcessUser struct {
	User   string  // a uid or a user name, never empty
	Group  *int64  // runAsGroup; nil means the user's group in /etc/passwd, else 0
	Groups []int64 // fsGroup and supplementalGroups, added to the process's groups
	Strict bool    // supplementalGroupsPolicy Strict: no groups from the image's /etc/group
}

// ContainerState is the coarse state of a container's task.
type ContainerState int

const (
	StateCreated ContainerState = iota // container exists, task not started
	StateRunning
	StateExited
	StateUnknown
)

// ContainerStatus is what the runtime knows about one container, read back
// from containerd labels and task state.
type ContainerStatus struct {
	ID           string
	PodUID       string
	PodName      string
	PodNamespace string
	Name         string
	Init         bool
	SpecHash     string
	RestartCount int
	ImageRef     string
	ImageID      string
	State        ContainerState
	PID          uint32
	CreatedAt    time.Time
	ExitCode     int
	FinishedAt   time.Time
	LastState    *v1.ContainerStateTerminated
	User         *v1.LinuxContainerUser // the resolved process user, if known
	// OOMKilled: the cgroup's OOM killer ended a process of this run
	// (durable: recorded when containerd reported it).
	OOMKilled bool
	// Sandbox is the epoch of the sandbox the run was started in.
	Sandbox string
	// Reason and Message override the termination's (a run the runtime
	// could not start ends as StartError).
	Reason, Message string
}

// ExitEvent reports that a container's main process exited, or that its
// OOM kill was recorded after its exit (ExitCode 0 then): either way its
// pod is synced again.
type ExitEvent struct {
	ContainerID string
	PodUID      string
	ExitCode    int
	ExitedAt    time.Time
}
