package runner

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/noderun/noderun/manifests"
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

// steppedClock is the real clock after the wall clock was stepped forward:
// as with time.Since, only a time without a monotonic reading sees the step.
type steppedClock struct {
	realClock
	step atomic.Int64
}

func (c *steppedClock) Since(t time.Time) time.Duration {
	d := time.Since(t)
	if t == t.Round(0) { // Round(0) strips the monotonic reading
		d += time.Duration(c.step.Load())
	}
	return d
}

// An NTP step forward (an RTC-less board at its first sync) must not make
// the sync loop look stalled.
func TestHealthzIgnoresWallClockStep(t *testing.T) {
	clock := &steppedClock{}
	e := New(Config{StateDir: t.TempDir(), RunDir: t.TempDir(), Clock: clock}, newFakeRuntime(clock), &fakeNetwork{})
	snaps := make(chan manifests.Snapshot)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx, snaps, 1) }()
	defer func() {
		cancel()
		<-done
	}()
	snaps <- manifests.Snapshot{Source: "file:/test"}
	waitFor(t, "ready", func() bool { return e.ready.Load() })
	clock.step.Store(int64(time.Hour))
	if err := e.Healthy(context.Background()); err != nil {
		t.Fatalf("after a wall-clock step: %v, want healthy", err)
	}
}
