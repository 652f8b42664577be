package e2e

import (
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"
)

// TestHealthzPort: with --healthz-port, GET /healthz on plain HTTP answers
// "ok" as the kubelet's port does, for kubeadm; each check is listed on
// ?verbose. (The failure answer, a stalled sync loop, is proven with a
// fake clock in runner and kubeapi: a real loop cannot be stalled from
// outside without stopping the server too.)
func TestHealthzPort(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0") // a free port, given back for noderun
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	newNode(t, "--healthz-port", strconv.Itoa(port))
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	for path, want := range map[string]string{
		"/healthz":          "ok",
		"/healthz?verbose":  "[+]ping ok\n[+]syncloop ok\nhealthz check passed\n",
		"/healthz/syncloop": "ok",
	} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(b) != want {
			t.Errorf("GET %s: %d %q, want 200 %q", path, resp.StatusCode, b, want)
		}
	}
}
