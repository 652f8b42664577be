package kubeapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/crilog"
)

func TestMetrics(t *testing.T) {
	m := NewMetrics()
	s := New(testCreds, WithMetrics(m))
	running := phasePod("web", v1.PodRunning)
	running.Status.ContainerStatuses = []v1.ContainerStatus{{Name: "main", State: v1.ContainerState{Running: &v1.ContainerStateRunning{}}}}
	be := &fakeBackend{pods: []v1.Pod{running, phasePod("db", v1.PodPending)}}
	s.Ready(be, nil)
	srv := httptest.NewServer(s)
	defer srv.Close()

	get(t, srv, "/api/v1/pods", "").Body.Close() // db seen Pending
	// db starts: its start is timed.
	started := phasePod("db", v1.PodRunning)
	be.set([]v1.Pod{running, started}, nil)
	deadline := time.Now().Add(30 * time.Second)
	m.ProbeResult("Liveness", "failed", "main", "web", "default", "uid-web")
	m.RuntimeOperation("start_container", 20*time.Millisecond, nil)
	m.RuntimeOperation("pull_image", time.Second, errors.New("offline"))
	m.ImagePull(errors.New("offline"))
	m.LogStreams(func(context.Context) ([]crilog.StreamStats, error) {
		return []crilog.StreamStats{{Path: "/var/log/pods/a/main/0.log", Dropped: 7, Dropping: true}, {Path: "/var/log/pods/b/main/0.log"}}, nil
	})

	var body string
	for {
		resp := get(t, srv, "/metrics", "")
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = string(b)
		if strings.Contains(body, "kubelet_pod_start_duration_seconds_count 1") || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, want := range []string{
		"kubelet_running_pods 2",
		`kubelet_running_containers{container_state="running"} 1`,
		"kubelet_pod_start_duration_seconds_count 1",
		`prober_probe_total{container="main",namespace="default",pod="web",pod_uid="uid-web",probe_type="Liveness",result="failed"} 1`,
		`kubelet_runtime_operations_duration_seconds_count{operation_type="start_container"} 1`,
		`kubelet_runtime_operations_errors_total{operation_type="pull_image"} 1`,
		`noderun_image_pulls_total{result="failure"} 1`,
		`noderun_log_dropped_lines_total{log_path="/var/log/pods/a/main/0.log"} 7`,
		`noderun_log_dropping{log_path="/var/log/pods/a/main/0.log"} 1`,
		`noderun_log_dropped_lines_total{log_path="/var/log/pods/b/main/0.log"} 0`,
		`noderun_manifest_source_errors{source="file:/etc/pods"} 1`,
		"go_goroutines",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	// Without a token, nothing.
	if code, _ := do(t, s, "GET", "/metrics", ""); code != 401 {
		t.Errorf("/metrics without a token: %d", code)
	}
}

// probeSeries counts the prober_probe_total series.
func probeSeries(t *testing.T, m *Metrics) int {
	t.Helper()
	families, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "prober_probe_total" {
			return len(f.GetMetric())
		}
	}
	return 0
}

// A pod's probe series go with the pod, or once it ended, as the kubelet's
// go with its probe workers: manifest churn does not grow them.
func TestProbeSeriesGoWithTheirPod(t *testing.T) {
	m := NewMetrics()
	s := New(testCreds, WithMetrics(m))
	be := &fakeBackend{}
	s.Ready(be, nil)
	const churn = 50
	for i := range churn {
		p := phasePod(fmt.Sprintf("web-%d", i), v1.PodRunning)
		be.set([]v1.Pod{p}, nil) // the one before goes
		s.sync()
		for _, kind := range []string{"Liveness", "Readiness"} {
			m.ProbeResult(kind, "successful", "main", p.Name, p.Namespace, string(p.UID))
		}
	}
	if n := probeSeries(t, m); n != 2 {
		t.Errorf("after %d pods came and went: %d probe series, want the last pod's 2", churn, n)
	}
	ended := phasePod(fmt.Sprintf("web-%d", churn-1), v1.PodFailed)
	be.set([]v1.Pod{ended}, nil)
	s.sync()
	if n := probeSeries(t, m); n != 0 {
		t.Errorf("the pod ended: %d probe series, want 0", n)
	}
	// A late result from a worker whose pod the engine forgot.
	m.ProbeResult("Liveness", "successful", "main", "", "", "uid-gone")
	if n := probeSeries(t, m); n != 0 {
		t.Errorf("a result for a pod the engine no longer knows made %d series", n)
	}
}
