package main

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/noderun/noderun/crilog"
)

// GET /logs answers 503 while no collector is connected, refuses browser
// requests, and leaves every other route to the engine.
func TestLogStreamsRoute(t *testing.T) {
	h := crilog.NewHolder("/nonexistent.sock", func() error { return nil }, slog.New(slog.DiscardHandler))
	engine := http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) { rw.WriteHeader(http.StatusTeapot) })
	api := withLogStreams(engine, h)
	for _, tc := range []struct {
		name, path, origin string
		want               int
		body               string
	}{
		{"no collector", "/logs", "", http.StatusServiceUnavailable, "no log collector connected"},
		{"browser", "/logs", "http://evil.example", http.StatusForbidden, "browser requests are refused"},
		{"engine", "/pods", "", http.StatusTeapot, ""},
	} {
		req := httptest.NewRequest(http.MethodGet, tc.path, nil)
		if tc.origin != "" {
			req.Header.Set("Origin", tc.origin)
		}
		rec := httptest.NewRecorder()
		api.ServeHTTP(rec, req)
		if rec.Code != tc.want || !strings.Contains(rec.Body.String(), tc.body) {
			t.Errorf("%s: %d %q, want %d with %q", tc.name, rec.Code, rec.Body.String(), tc.want, tc.body)
		}
	}
}
