package main

import (
	"context"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/kubeapi"
	"github.com/noderun/noderun/runner"
)

// meteredRuntime times every call the engine makes to containerd, under
// the kubelet's operation_type names (kubelet_runtime_operations_*), and
// counts image pulls.
type meteredRuntime struct {
	runner.Runtime
	m *kubeapi.Metrics
}

var _ runner.Runtime = meteredRuntime{}

func (r meteredRuntime) observe(op string, start time.Time, err error) {
	r.m.RuntimeOperation(op, time.Since(start), err)
}

func (r meteredRuntime) EnsureImage(ctx context.Context, ref string, policy v1.PullPolicy) (runner.ImageConfig, error) {
	start := time.Now()
	cfg, err := r.Runtime.EnsureImage(ctx, ref, policy)
	r.observe("pull_image", start, err)
	r.m.ImagePull(err)
	return cfg, err
}

func (r meteredRuntime) ListContainers(ctx context.Context, podUID string) ([]runner.ContainerStatus, error) {
	start := time.Now()
	out, err := r.Runtime.ListContainers(ctx, podUID)
	r.observe("list_containers", start, err)
	return out, err
}

func (r meteredRuntime) StartContainer(ctx context.Context, cfg *runner.ContainerConfig) (*v1.LinuxContainerUser, error) {
	start := time.Now()
	u, err := r.Runtime.StartContainer(ctx, cfg)
	r.observe("start_container", start, err)
	return u, err
}

func (r meteredRuntime) StopContainer(ctx context.Context, id string, grace time.Duration) error {
	start := time.Now()
	err := r.Runtime.StopContainer(ctx, id, grace)
	r.observe("stop_container", start, err)
	return err
}

func (r meteredRuntime) RemoveContainer(ctx context.Context, id string) error {
	start := time.Now()
	err := r.Runtime.RemoveContainer(ctx, id)
	r.observe("remove_container", start, err)
	return err
}

func (r meteredRuntime) ExecSync(ctx context.Context, id string, cmd []string, timeout time.Duration) (runner.ExecResult, error) {
	start := time.Now()
	res, err := r.Runtime.ExecSync(ctx, id, cmd, timeout)
	r.observe("exec_sync", start, err)
	return res, err
}

func (r meteredRuntime) Ping(ctx context.Context) error {
	start := time.Now()
	err := r.Runtime.Ping(ctx)
	r.observe("version", start, err)
	return err
}

func (r meteredRuntime) GCImages(ctx context.Context, keep []string, p runner.ImageGCPolicy) ([]string, error) {
	start := time.Now()
	out, err := r.Runtime.GCImages(ctx, keep, p)
	r.observe("remove_image", start, err)
	return out, err
}
