package kubeapi

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/noderun/noderun/crilog"
	"github.com/noderun/noderun/manifests"
)

type fakeStatus struct {
	fakeBackend
	healthErr error
	logs      []crilog.StreamStats
	logsErr   error
}

func (f *fakeStatus) Healthy(context.Context) error { return f.healthErr }
func (f *fakeStatus) Sources() []manifests.SourceInfo {
	return []manifests.SourceInfo{{Source: "file:/etc/pods", Errors: []string{"x.yaml: bad"}}}
}

func (f *fakeStatus) LogStreams(context.Context) ([]crilog.StreamStats, error) {
	return f.logs, f.logsErr
}

func statusGet(h http.Handler, path string, header ...string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodGet, path, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func TestStatusHandler(t *testing.T) {
	b := &fakeStatus{fakeBackend: fakeBackend{pods: []v1.Pod{testPod("default", "web")}}}
	h := statusHandler(b)
	if rec := statusGet(h, "/pods", "Origin", "http://evil.example"); rec.Code != http.StatusForbidden {
		t.Fatalf("request with an Origin header: %d, want 403", rec.Code)
	}
	if rec := statusGet(h, "/pods"); rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"kind":"PodList"`) {
		t.Fatalf("GET /pods: %d %q, want a PodList", rec.Code, rec.Body)
	}
	if rec := statusGet(h, "/healthz"); rec.Code != http.StatusOK {
		t.Fatalf("healthy: %d", rec.Code)
	}
	b.healthErr = errors.New("containerd: connection refused")
	if rec := statusGet(h, "/healthz"); rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "connection refused") {
		t.Fatalf("unhealthy: %d %q, want 503 with the reason", rec.Code, rec.Body)
	}
	rec := statusGet(h, "/manifests")
	var ms ManifestSources
	if err := json.Unmarshal(rec.Body.Bytes(), &ms); err != nil || len(ms.Sources) != 1 || ms.Sources[0].Errors[0] != "x.yaml: bad" {
		t.Fatalf("GET /manifests: %s (%v)", rec.Body, err)
	}
}

// `noderun pods` asks the status socket for a Table: the API's pod columns,
// the namespace in the rows' metadata, and an age from the pod's start.
func TestStatusHandlerPodTable(t *testing.T) {
	p := testPod("kube-system", "dns")
	start := metav1.NewTime(time.Now().Add(-90 * time.Second))
	p.Status = v1.PodStatus{Phase: v1.PodRunning, StartTime: &start, PodIP: "10.0.0.7", PodIPs: []v1.PodIP{{IP: "10.0.0.7"}}}
	b := &fakeStatus{fakeBackend: fakeBackend{pods: []v1.Pod{p}}}
	rec := statusGet(statusHandler(b), "/pods", "Accept", "application/json;as=Table;g=meta.k8s.io;v=v1")
	var tab metav1.Table
	if err := json.Unmarshal(rec.Body.Bytes(), &tab); err != nil || rec.Code != http.StatusOK {
		t.Fatalf("GET /pods as a Table: %d %s (%v)", rec.Code, rec.Body, err)
	}
	if len(tab.ColumnDefinitions) != len(podColumns) || len(tab.Rows) != 1 {
		t.Fatalf("table = %+v", tab)
	}
	var m metav1.PartialObjectMetadata
	if err := json.Unmarshal(tab.Rows[0].Object.Raw, &m); err != nil || m.Namespace != "kube-system" {
		t.Errorf("row metadata = %s (%v), want the namespace", tab.Rows[0].Object.Raw, err)
	}
	cells := tab.Rows[0].Cells
	if cells[0] != "dns" || cells[2] != "Running" || cells[4] != "90s" || cells[5] != "10.0.0.7" {
		t.Errorf("cells = %q", cells)
	}
	if !b.pods[0].CreationTimestamp.IsZero() {
		t.Error("the table set the backend's own pod's creationTimestamp")
	}
	if rec := statusGet(statusHandler(b), "/pods", "Accept", "application/yaml"); rec.Code != http.StatusNotAcceptable {
		t.Errorf("Accept: application/yaml: %d, want 406", rec.Code)
	}
}

// GET /logs answers each stream, sorted, or 503 while no collector is
// connected; a browser request is refused like every other route's.
func TestStatusLogStreams(t *testing.T) {
	b := &fakeStatus{logs: []crilog.StreamStats{{Key: "k8s/b", Dropped: 2}, {Key: "k8s/a"}}}
	h := statusHandler(b)
	rec := statusGet(h, "/logs")
	var got []crilog.StreamStats
	if err := json.Unmarshal(rec.Body.Bytes(), &got); rec.Code != http.StatusOK || err != nil || len(got) != 2 || got[0].Key != "k8s/a" || got[1].Dropped != 2 {
		t.Fatalf("GET /logs: %d %s (%v), want both streams by key", rec.Code, rec.Body, err)
	}
	if rec := statusGet(h, "/logs", "Origin", "http://evil.example"); rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), "browser requests are refused") {
		t.Fatalf("browser: %d %q, want 403", rec.Code, rec.Body)
	}
	b.logsErr = errors.New("no log collector connected")
	if rec := statusGet(h, "/logs"); rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "no log collector connected") {
		t.Fatalf("no collector: %d %q, want 503 with the reason", rec.Code, rec.Body)
	}
}

// Before Ready every route answers 503 with what startup waits for.
func TestStatusServerUnavailableUntilReady(t *testing.T) {
	s := &StatusServer{}
	if rec := statusGet(s, "/healthz"); rec.Code != http.StatusServiceUnavailable || strings.TrimSpace(rec.Body.String()) != "starting" {
		t.Fatalf("before Ready: %d %q, want 503 starting", rec.Code, rec.Body)
	}
	s.SetWaiting("waiting for containerd: no socket")
	if rec := statusGet(s, "/logs"); rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "waiting for containerd") {
		t.Fatalf("waiting: %d %q, want 503 saying what it waits for", rec.Code, rec.Body)
	}
	s.Ready(&fakeStatus{})
	if rec := statusGet(s, "/healthz"); rec.Code != http.StatusOK {
		t.Fatalf("after Ready: %d %q", rec.Code, rec.Body)
	}
}
