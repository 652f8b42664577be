package runner

import (
	"context"
	"time"

	v1 "k8s.io/api/core/v1"
)

// RuntimeMetrics is told of every runtime call under the kubelet's
// operation_type names (kubelet_runtime_operations_*) and of every image
// made available; kubeapi.Metrics satisfies it.
type RuntimeMetrics interface {
	RuntimeOperation(op string, d time.Duration, err error)
	ImagePull(err error)
}

// instrumented times every Runtime method, as the kubelet's
// instrumented_services.go does. A named field, not an embedded interface:
// a method added to Runtime does not compile here until it is measured.
type instrumented struct {
	rt Runtime
	m  RuntimeMetrics
}

var _ Runtime = instrumented{}

// observe records the call op that began at start.
func (r instrumented) observe(op string, start time.Time, err error) {
	r.m.RuntimeOperation(op, time.Since(start), err)
}

func (r instrumented) EnsureImage(ctx context.Context, ref string, policy v1.PullPolicy) (ImageConfig, error) {
	start := time.Now()
	cfg, err := r.rt.EnsureImage(ctx, ref, policy)
	r.observe("pull_image", start, err)
	r.m.ImagePull(err)
	return cfg, err
}

func (r instrumented) ListContainers(ctx context.Context, podUID string) ([]ContainerStatus, error) {
	start := time.Now()
	out, err := r.rt.ListContainers(ctx, podUID)
	r.observe("list_containers", start, err)
	return out, err
}

func (r instrumented) StartContainer(ctx context.Context, cfg *ContainerConfig) (Started, error) {
	start := time.Now()
	s, err := r.rt.StartContainer(ctx, cfg)
	r.observe("start_container", start, err)
	return s, err
}

func (r instrumented) CreateContainer(ctx context.Context, cfg *ContainerConfig, ready func() error) (CreatedContainer, error) {
	start := time.Now()
	c, err := r.rt.CreateContainer(ctx, cfg, ready)
	r.observe("create_container", start, err)
	if err != nil {
		return nil, err
	}
	return instrumentedCreated{c, r}, nil
}

// instrumentedCreated is a created container whose Start counts as
// start_container, as the kubelet's StartContainer after CreateContainer.
type instrumentedCreated struct {
	c CreatedContainer
	r instrumented
}

func (c instrumentedCreated) Start(ctx context.Context) (Started, error) {
	start := time.Now()
	s, err := c.c.Start(ctx)
	c.r.observe("start_container", start, err)
	return s, err
}

func (r instrumented) StopContainer(ctx context.Context, id string, grace time.Duration) error {
	start := time.Now()
	err := r.rt.StopContainer(ctx, id, grace)
	r.observe("stop_container", start, err)
	return err
}

func (r instrumented) RemoveContainer(ctx context.Context, id string) error {
	start := time.Now()
	err := r.rt.RemoveContainer(ctx, id)
	r.observe("remove_container", start, err)
	return err
}

// Exits is the kubelet's get_container_events: what is timed is the
// subscription, not the stream it returns.
func (r instrumented) Exits(ctx context.Context) (<-chan ExitEvent, error) {
	start := time.Now()
	ch, err := r.rt.Exits(ctx)
	r.observe("get_container_events", start, err)
	return ch, err
}

func (r instrumented) ExecSync(ctx context.Context, id string, cmd []string, timeout time.Duration) (ExecResult, error) {
	start := time.Now()
	res, err := r.rt.ExecSync(ctx, id, cmd, timeout)
	r.observe("exec_sync", start, err)
	return res, err
}

func (r instrumented) Ping(ctx context.Context) error {
	start := time.Now()
	err := r.rt.Ping(ctx)
	r.observe("version", start, err)
	return err
}

// MountImageVolume and RemoveImageVolumes are not operations of the
// kubelet's runtime but parts of CRI's CreateContainer and
// RemovePodSandbox, which containerd carries out: they are not measured
// apart.
func (r instrumented) MountImageVolume(ctx context.Context, podUID, ref, dir string) (string, error) {
	return r.rt.MountImageVolume(ctx, podUID, ref, dir)
}

func (r instrumented) RemoveImageVolumes(ctx context.Context, podUID string) error {
	return r.rt.RemoveImageVolumes(ctx, podUID)
}

func (r instrumented) GCImages(ctx context.Context, keep []string, p ImageGCPolicy) ([]string, error) {
	start := time.Now()
	out, err := r.rt.GCImages(ctx, keep, p)
	r.observe("remove_image", start, err)
	return out, err
}
