package kubeapi

import (
	"net/http"
	"strings"
	"testing"
)

// The node log server gets the admin token's requests, with the path under
// /logs the route matched and the query; the view token is refused as the
// API server refuses nodes/proxy, another node is not found, and without
// WithNodeLogs there is no /logs/.
func TestNodeLogRoutes(t *testing.T) {
	var got []string
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.URL.Path+"?"+r.URL.RawQuery)
		w.WriteHeader(http.StatusTeapot)
	})
	s := New(testCreds, WithNodeLogs(h))
	s.Ready(&fakeBackend{}, nil)
	tests := []struct {
		path, token string
		code        int
	}{
		{"/api/v1/nodes/node1/proxy/logs/?query=noderun", testCreds.AdminToken, http.StatusTeapot},
		{"/logs/syslog", testCreds.AdminToken, http.StatusTeapot},
		{"/api/v1/nodes/node1/proxy/logs/a%2Fb.log", testCreds.AdminToken, http.StatusTeapot},
		{"/api/v1/nodes/node1/proxy/logs/?query=noderun", testCreds.ViewToken, http.StatusForbidden},
		{"/logs/", testCreds.ViewToken, http.StatusForbidden},
		{"/api/v1/nodes/other/proxy/logs/", testCreds.AdminToken, http.StatusNotFound},
	}
	for _, tt := range tests {
		if code, st := do(t, s, "GET", tt.path, tt.token); code != tt.code {
			t.Errorf("GET %s: %d %q, want %d", tt.path, code, st.Message, tt.code)
		} else if code == http.StatusForbidden && st.Message != `nodes "node1" is forbidden: the view token cannot get resource "nodes/proxy"; use the admin token (noderun kubeconfig --admin)` {
			t.Errorf("GET %s: %q", tt.path, st.Message)
		}
	}
	if want := "/?query=noderun|/syslog?|/a/b.log?"; strings.Join(got, "|") != want {
		t.Errorf("the log server got %q, want %q", strings.Join(got, "|"), want)
	}
	plain := New(testCreds)
	plain.Ready(&fakeBackend{}, nil)
	if code, _ := do(t, plain, "GET", "/logs/", testCreds.AdminToken); code != http.StatusNotFound {
		t.Errorf("without WithNodeLogs: %d, want 404", code)
	}
}
