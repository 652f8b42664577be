package prober

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// serverTarget splits an httptest server's address into a Target and port.
func serverTarget(t *testing.T, addr string) (Target, int) {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(port)
	return Target{PodIP: host, Container: &v1.Container{Name: "app", Ports: []v1.ContainerPort{{Name: "http", ContainerPort: int32(p)}}}}, p
}

func httpProbe(port intstr.IntOrString, path string) *v1.ProbeHandler {
	return &v1.ProbeHandler{HTTPGet: &v1.HTTPGetAction{Port: port, Path: path}}
}

func TestHTTPProbe(t *testing.T) {
	var lastUA, lastAccept, lastHost, lastCustom string
	mux := http.NewServeMux()
	mux.HandleFunc("/ok", func(w http.ResponseWriter, r *http.Request) {
		lastUA, lastAccept, lastHost, lastCustom = r.UserAgent(), r.Header.Get("Accept"), r.Host, r.Header.Get("X-Custom")
		fmt.Fprint(w, "fine")
	})
	mux.HandleFunc("/fail", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) })
	mux.HandleFunc("/slow", func(w http.ResponseWriter, _ *http.Request) { time.Sleep(2 * time.Second) })
	mux.HandleFunc("/hop", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/ok", http.StatusFound) })
	mux.HandleFunc("/loop", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/loop", http.StatusFound) })
	mux.HandleFunc("/away", func(w http.ResponseWriter, r *http.Request) {
		u := *r.URL
		u.Scheme, u.Host, u.Path = "http", "127.0.0.2:1", "/ok" // another host: not followed
		http.Redirect(w, r, u.String(), http.StatusFound)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	tgt, port := serverTarget(t, srv.Listener.Addr().String())
	ctx := context.Background()

	res, _, err := Do(ctx, httpProbe(intstr.FromInt(port), "/ok"), time.Second, tgt, nil)
	if res != Success || err != nil || lastUA != userAgent || lastAccept != "*/*" {
		t.Errorf("/ok: %v %v, user agent %q accept %q", res, err, lastUA, lastAccept)
	}
	// Named port, custom headers and a Host header.
	h := httpProbe(intstr.FromString("http"), "ok")
	h.HTTPGet.HTTPHeaders = []v1.HTTPHeader{{Name: "Host", Value: "example.test"}, {Name: "X-Custom", Value: "1"}, {Name: "User-Agent", Value: "mine"}}
	if res, _, _ := Do(ctx, h, time.Second, tgt, nil); res != Success || lastHost != "example.test" || lastCustom != "1" || lastUA != "mine" {
		t.Errorf("headers: %v host %q custom %q ua %q", res, lastHost, lastCustom, lastUA)
	}
	res, msg, _ := Do(ctx, httpProbe(intstr.FromInt(port), "/fail"), time.Second, tgt, nil)
	if res != Failure || msg != "HTTP probe failed with statuscode: 503" {
		t.Errorf("/fail: %v %q", res, msg)
	}
	start := time.Now()
	if res, msg, _ := Do(ctx, httpProbe(intstr.FromInt(port), "/slow"), 200*time.Millisecond, tgt, nil); res != Failure || time.Since(start) > time.Second {
		t.Errorf("/slow with a 200ms timeout: %v %q after %s", res, msg, time.Since(start))
	}
	if res, msg, _ := Do(ctx, httpProbe(intstr.FromInt(port), "/hop"), time.Second, tgt, nil); res != Success || msg != "fine" {
		t.Errorf("same-host redirect: %v %q, want it followed to /ok", res, msg)
	}
	if res, msg, _ := Do(ctx, httpProbe(intstr.FromInt(port), "/away"), time.Second, tgt, nil); res != Success || !strings.HasPrefix(msg, "Probe terminated redirects") {
		t.Errorf("redirect to another host: %v %q, want the 302 itself to count as success", res, msg)
	}
	if res, msg, _ := Do(ctx, httpProbe(intstr.FromInt(port), "/loop"), time.Second, tgt, nil); res != Failure || !strings.Contains(msg, "stopped after 10 redirects") {
		t.Errorf("redirect loop: %v %q", res, msg)
	}
	if _, _, err := Do(ctx, httpProbe(intstr.FromString("nope"), "/ok"), time.Second, tgt, nil); err == nil || !strings.Contains(err.Error(), "couldn't find port") {
		t.Errorf("unknown port name: %v", err)
	}
	srv.Close()
	if res, msg, _ := Do(ctx, httpProbe(intstr.FromInt(port), "/ok"), time.Second, tgt, nil); res != Failure || !strings.Contains(msg, "connection refused") {
		t.Errorf("closed server: %v %q", res, msg)
	}
}

func TestHTTPSProbeSkipsVerification(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "tls") }))
	defer srv.Close()
	tgt, port := serverTarget(t, srv.Listener.Addr().String())
	h := httpProbe(intstr.FromInt(port), "/")
	h.HTTPGet.Scheme = v1.URISchemeHTTPS
	if res, msg, err := Do(context.Background(), h, time.Second, tgt, nil); res != Success || msg != "tls" {
		t.Errorf("self-signed HTTPS: %v %q %v", res, msg, err)
	}
}

func TestTCPProbe(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tgt, port := serverTarget(t, l.Addr().String())
	h := &v1.ProbeHandler{TCPSocket: &v1.TCPSocketAction{Port: intstr.FromInt(port)}}
	if res, _, _ := Do(context.Background(), h, time.Second, tgt, nil); res != Success {
		t.Errorf("open port: %v", res)
	}
	l.Close()
	if res, msg, _ := Do(context.Background(), h, time.Second, tgt, nil); res != Failure || !strings.Contains(msg, "refused") {
		t.Errorf("closed port: %v %q", res, msg)
	}
}

func TestGRPCProbe(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus("db", healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(srv, hs)
	go srv.Serve(l)
	defer srv.Stop()
	tgt, port := serverTarget(t, l.Addr().String())
	probe := func(service *string) (Result, string) {
		res, msg, err := Do(context.Background(), &v1.ProbeHandler{GRPC: &v1.GRPCAction{Port: int32(port), Service: service}}, time.Second, tgt, nil)
		if err != nil {
			t.Fatal(err)
		}
		return res, msg
	}
	if res, msg := probe(nil); res != Success || msg != "service healthy" {
		t.Errorf("serving: %v %q", res, msg)
	}
	db := "db"
	if res, msg := probe(&db); res != Failure || msg != `service unhealthy (responded with "NOT_SERVING")` {
		t.Errorf("not serving: %v %q", res, msg)
	}
	other := "other"
	if res, msg := probe(&other); res != Failure || !strings.Contains(msg, "health rpc probe failed") {
		t.Errorf("unknown service: %v %q", res, msg)
	}
	srv.Stop()
	start := time.Now()
	if res, _ := probe(nil); res != Failure || time.Since(start) > 3*time.Second {
		t.Errorf("no server: %v after %s", res, time.Since(start))
	}
}

// fakeExec answers exec probes and hooks.
type fakeExec struct {
	out      string
	code     int
	timedOut bool
	err      error
	got      [][]string
}

func (f *fakeExec) exec(_ context.Context, _ string, cmd []string, _ time.Duration) ([]byte, int, bool, error) {
	f.got = append(f.got, cmd)
	return []byte(f.out), f.code, f.timedOut, f.err
}

func TestExecProbe(t *testing.T) {
	c := &v1.Container{Name: "app", Env: []v1.EnvVar{{Name: "F", Value: "/tmp/healthy"},
		{Name: "D", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.name"}}}}}
	h := &v1.ProbeHandler{Exec: &v1.ExecAction{Command: []string{"cat", "$(F)", "$(D)", "$$(F)"}}}
	tgt := Target{ContainerID: "c1", Container: c}
	for _, tc := range []struct {
		name string
		fake fakeExec
		want Result
		msg  string
		err  bool
	}{
		{"exit 0", fakeExec{out: "ok"}, Success, "ok", false},
		{"exit 1", fakeExec{out: "cat: can't open", code: 1}, Failure, "cat: can't open", false},
		{"timeout", fakeExec{timedOut: true, code: 137}, Failure, `command "cat /tmp/healthy $(D) $(F)" timed out`, false},
		{"runtime error", fakeExec{err: errors.New("not running")}, Unknown, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.fake
			res, msg, err := Do(context.Background(), h, time.Second, tgt, f.exec)
			if res != tc.want || msg != tc.msg || (err != nil) != tc.err {
				t.Errorf("got %v %q %v, want %v %q err=%t", res, msg, err, tc.want, tc.msg, tc.err)
			}
			// Only literal env values are expanded; $$ escapes.
			if want := "cat /tmp/healthy $(D) $(F)"; strings.Join(f.got[0], " ") != want {
				t.Errorf("command %q, want %q", f.got[0], want)
			}
		})
	}
}

func TestDoHook(t *testing.T) {
	ctx := context.Background()
	exec := &fakeExec{code: 1, out: "boom"}
	err := DoHook(ctx, &v1.LifecycleHandler{Exec: &v1.ExecAction{Command: []string{"setup"}}}, Target{Container: &v1.Container{Name: "app"}}, exec.exec)
	if err == nil || !strings.Contains(err.Error(), "exited with 1") || !strings.Contains(err.Error(), "boom") {
		t.Errorf("failing exec hook: %v", err)
	}
	if err := DoHook(ctx, &v1.LifecycleHandler{Exec: &v1.ExecAction{Command: []string{"ok"}}}, Target{}, (&fakeExec{}).exec); err != nil {
		t.Errorf("exec hook exit 0: %v", err)
	}
	hits := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits++
		w.WriteHeader(http.StatusInternalServerError)
	}))
	tgt, port := serverTarget(t, srv.Listener.Addr().String())
	hook := &v1.LifecycleHandler{HTTPGet: &v1.HTTPGetAction{Port: intstr.FromInt(port), Path: "/quit"}}
	if err := DoHook(ctx, hook, tgt, nil); err != nil || hits != 1 {
		t.Errorf("http hook answered 500: %v (hits %d); the kubelet does not look at the status", err, hits)
	}
	srv.Close()
	if err := DoHook(ctx, hook, tgt, nil); err == nil {
		t.Error("http hook to a closed port succeeded")
	}
	start := time.Now()
	if err := DoHook(ctx, &v1.LifecycleHandler{Sleep: &v1.SleepAction{Seconds: 1}}, tgt, nil); err != nil || time.Since(start) < time.Second {
		t.Errorf("sleep 1: %v after %s", err, time.Since(start))
	}
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := DoHook(cctx, &v1.LifecycleHandler{Sleep: &v1.SleepAction{Seconds: 30}}, tgt, nil); err == nil || time.Since(start) > 3*time.Second {
		t.Errorf("sleep cut by its context: %v", err)
	}
}
