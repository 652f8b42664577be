package kubeapi

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/manifests"
)

type fakeStatus struct {
	fakeBackend
	healthErr error
}

func (f *fakeStatus) Healthy(context.Context) error { return f.healthErr }
func (f *fakeStatus) Sources() []manifests.SourceInfo {
	return []manifests.SourceInfo{{Source: "file:/etc/pods", Errors: []string{"x.yaml: bad"}}}
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
	h := StatusHandler(b)
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
