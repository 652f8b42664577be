package kubeapi

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The answers are the kubelet's healthz port's: "ok"; on a failure 500
// with one line per check and the reason withheld.
func TestHealthzAnswersAsTheKubelet(t *testing.T) {
	h := &Healthz{log: slog.New(slog.DiscardHandler)}
	get := func(path string, hdr ...string) (int, string) {
		r := httptest.NewRequest(http.MethodGet, path, nil)
		if len(hdr) == 2 {
			r.Header.Set(hdr[0], hdr[1])
		}
		rw := httptest.NewRecorder()
		h.ServeHTTP(rw, r)
		b, _ := io.ReadAll(rw.Result().Body)
		return rw.Code, string(b)
	}
	failed := "[+]ping ok\n[-]syncloop failed: reason withheld\nhealthz check failed\n"
	for _, tc := range []struct {
		name, path string
		loop       func() error // nil: before Ready
		code       int
		body       string
	}{
		{"before the engine", "/healthz", nil, 500, failed},
		{"healthy", "/healthz", func() error { return nil }, 200, "ok"},
		{"verbose", "/healthz?verbose", func() error { return nil }, 200, "[+]ping ok\n[+]syncloop ok\nhealthz check passed\n"},
		{"stalled", "/healthz", func() error { return errors.New("sync loop stalled for 3m1s") }, 500, failed},
		{"stalled, excluded", "/healthz?exclude=syncloop", func() error { return errors.New("stalled") }, 200, "ok"},
		{"one check", "/healthz/syncloop", func() error { return errors.New("sync loop stalled for 3m1s") }, 500, "internal server error: sync loop stalled for 3m1s\n"},
		{"ping", "/healthz/ping", func() error { return errors.New("stalled") }, 200, "ok"},
		{"unknown check", "/healthz/log", func() error { return nil }, 404, "404 page not found\n"},
		{"elsewhere", "/readyz", func() error { return nil }, 404, "404 page not found\n"},
	} {
		if tc.loop != nil {
			h.Ready(tc.loop)
		}
		if code, body := get(tc.path); code != tc.code || body != tc.body {
			t.Errorf("%s: GET %s = %d %q, want %d %q", tc.name, tc.path, code, body, tc.code, tc.body)
		}
	}
	if code, body := get("/healthz", "Origin", "http://evil.example"); code != http.StatusForbidden || !strings.Contains(body, "Origin") {
		t.Errorf("a browser's request: %d %q, want 403", code, body)
	}
}
