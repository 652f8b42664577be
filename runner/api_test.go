package runner

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func get(t *testing.T, h http.Handler, path string, header ...string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func TestHealthz(t *testing.T) {
	f := startEngine(t)
	h := f.e.Handler()
	if rec := get(t, h, "/healthz"); rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "first reconcile") {
		t.Fatalf("before the first reconcile: %d %q, want 503 with the reason", rec.Code, rec.Body)
	}
	f.send()
	waitFor(t, "ready", func() bool { return f.e.ready.Load() })
	if rec := get(t, h, "/healthz"); rec.Code != http.StatusOK {
		t.Fatalf("ready: %d %q, want 200", rec.Code, rec.Body)
	}
	f.rt.mu.Lock()
	f.rt.pingErr = errors.New("connection refused")
	f.rt.mu.Unlock()
	if rec := get(t, h, "/healthz"); rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "containerd: connection refused") {
		t.Fatalf("containerd down: %d %q, want 503 naming containerd", rec.Code, rec.Body)
	}
}

func TestAPIRefusesBrowserRequests(t *testing.T) {
	f := startEngine(t)
	h := f.e.Handler()
	if rec := get(t, h, "/pods", "Origin", "http://evil.example"); rec.Code != http.StatusForbidden {
		t.Fatalf("request with an Origin header: %d, want 403", rec.Code)
	}
	if rec := get(t, h, "/pods"); rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"kind":"PodList"`) {
		t.Fatalf("plain request: %d %q, want a PodList", rec.Code, rec.Body)
	}
}
