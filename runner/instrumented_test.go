package runner

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// opsMetrics records the RuntimeMetrics it is told.
type opsMetrics struct {
	ops    []string // operation_type of each call, in order
	failed []string // those that returned an error
	pulls  []error
}

func (m *opsMetrics) RuntimeOperation(op string, _ time.Duration, err error) {
	m.ops = append(m.ops, op)
	if err != nil {
		m.failed = append(m.failed, op)
	}
}

func (m *opsMetrics) ImagePull(err error) { m.pulls = append(m.pulls, err) }

// stubRuntime answers every call with err; a created container starts
// with it too.
type stubRuntime struct{ err error }

func (s stubRuntime) EnsureImage(context.Context, string, v1.PullPolicy) (ImageConfig, error) {
	return ImageConfig{}, s.err
}
func (s stubRuntime) ListContainers(context.Context, string) ([]ContainerStatus, error) {
	return nil, s.err
}
func (s stubRuntime) StartContainer(context.Context, *ContainerConfig) (Started, error) {
	return Started{}, s.err
}
func (s stubRuntime) CreateContainer(context.Context, *ContainerConfig, func() error) (CreatedContainer, error) {
	return s, nil // created even when err: its Start fails
}
func (s stubRuntime) Start(context.Context) (Started, error)                     { return Started{}, s.err }
func (s stubRuntime) StopContainer(context.Context, string, time.Duration) error { return s.err }
func (s stubRuntime) RemoveContainer(context.Context, string) error              { return s.err }
func (s stubRuntime) Exits(context.Context) (<-chan ExitEvent, error)            { return nil, s.err }
func (s stubRuntime) ExecSync(context.Context, string, []string, time.Duration) (ExecResult, error) {
	return ExecResult{}, s.err
}
func (s stubRuntime) Ping(context.Context) error { return s.err }
func (s stubRuntime) GCImages(context.Context, []string, ImageGCPolicy) ([]string, error) {
	return nil, s.err
}
func (s stubRuntime) MountImageVolume(context.Context, string, string, string) (string, error) {
	return "", s.err
}
func (s stubRuntime) RemoveImageVolumes(context.Context, string) error { return s.err }

// callAll calls every Runtime method once, and starts the container
// CreateContainer made.
func callAll(t *testing.T, rt Runtime) {
	t.Helper()
	ctx := context.Background()
	_, _ = rt.EnsureImage(ctx, "busybox", v1.PullIfNotPresent)
	_, _ = rt.ListContainers(ctx, "")
	_, _ = rt.StartContainer(ctx, &ContainerConfig{})
	c, err := rt.CreateContainer(ctx, &ContainerConfig{}, nil)
	if err != nil {
		t.Fatalf("CreateContainer: %v", err)
	}
	_, _ = c.Start(ctx)
	_ = rt.StopContainer(ctx, "c", time.Second)
	_ = rt.RemoveContainer(ctx, "c")
	_, _ = rt.Exits(ctx)
	_, _ = rt.ExecSync(ctx, "c", []string{"true"}, 0)
	_ = rt.Ping(ctx)
	_, _ = rt.GCImages(ctx, nil, ImageGCPolicy{})
}

// TestInstrumentedMeasuresEveryMethod: every runtime call is counted under
// the kubelet's operation_type, the container CreateContainer made (the
// way most containers start) included, and its Start as start_container.
func TestInstrumentedMeasuresEveryMethod(t *testing.T) {
	want := []string{"pull_image", "list_containers", "start_container", "create_container", "start_container",
		"stop_container", "remove_container", "get_container_events", "exec_sync", "version", "remove_image"}
	for _, fail := range []bool{false, true} {
		var err error
		if fail {
			err = errors.New("containerd gone")
		}
		m := &opsMetrics{}
		callAll(t, instrumented{stubRuntime{err}, m})
		if !slices.Equal(m.ops, want) {
			t.Errorf("failing %t: operations %q, want %q", fail, m.ops, want)
		}
		wantFailed := []string(nil)
		if fail {
			wantFailed = slices.DeleteFunc(slices.Clone(want), func(op string) bool { return op == "create_container" })
		}
		if !slices.Equal(m.failed, wantFailed) {
			t.Errorf("failing %t: errors counted for %q, want %q", fail, m.failed, wantFailed)
		}
		if len(m.pulls) != 1 || (m.pulls[0] != nil) != fail {
			t.Errorf("failing %t: image pulls %v, want one", fail, m.pulls)
		}
	}
}

// TestEngineMeasuresRuntime: with Config.Metrics the engine's runtime
// calls are measured; a created container counts when its start is made.
func TestEngineMeasuresRuntime(t *testing.T) {
	m := &opsMetrics{}
	e := New(Config{Metrics: m}, stubRuntime{}, nil)
	c, err := e.rt.CreateContainer(context.Background(), &ContainerConfig{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = c.Start(context.Background())
	if want := []string{"create_container", "start_container"}; !slices.Equal(m.ops, want) {
		t.Errorf("operations %q, want %q", m.ops, want)
	}
}
