package prober

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// seen is what a test server saw of the last request to a path.
type seen struct {
	host   string
	uri    string
	header http.Header
	close  bool
	hits   int
}

// probeServer is an HTTP server with the paths the tests probe.
type probeServer struct {
	*httptest.Server
	port int
	mu   sync.Mutex
	seen map[string]*seen

	opened, closed atomic.Int32 // connections
}

func (s *probeServer) record(r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.seen[r.URL.Path]
	if v == nil {
		v = &seen{}
		s.seen[r.URL.Path] = v
	}
	v.host, v.uri, v.header, v.close = r.Host, r.RequestURI, r.Header.Clone(), r.Close
	v.hits++
}

func (s *probeServer) saw(path string) seen {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v := s.seen[path]; v != nil {
		return *v
	}
	return seen{}
}

// newProbeServer serves on addr (127.0.0.1:0 or 127.0.0.2:0), plain or TLS.
func newProbeServer(t *testing.T, addr string, tls bool) *probeServer {
	t.Helper()
	s := &probeServer{seen: map[string]*seen{}}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") })
	mux.HandleFunc("/status/{code}", func(w http.ResponseWriter, r *http.Request) {
		code, _ := strconv.Atoi(r.PathValue("code"))
		w.WriteHeader(code)
		fmt.Fprintf(w, "body-%d", code)
	})
	// /redirect?to=URL answers 302 to URL.
	mux.HandleFunc("/redirect", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, r.URL.Query().Get("to"), http.StatusFound)
	})
	// /hops/N redirects to /hops/N-1; /hops/0 answers 200.
	mux.HandleFunc("/hops/{n}", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.PathValue("n"))
		if n == 0 {
			return
		}
		http.Redirect(w, r, "/hops/"+strconv.Itoa(n-1), http.StatusFound)
	})
	mux.HandleFunc("/loop", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/loop", http.StatusFound) })
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) { w.Write(make([]byte, 20<<10)) })
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
			// No answer at all: a 200 written once the client hangs up
			// could still reach its read loop while it closes the
			// connection, and the probe would pass.
			panic(http.ErrAbortHandler)
		case <-time.After(time.Minute): // far beyond any maxTook below
		}
	})
	mux.HandleFunc("/early-hints", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.WriteHeader(http.StatusOK)
	})
	// /short promises 100 bytes and sends 5.
	mux.HandleFunc("/short", func(w http.ResponseWriter, r *http.Request) {
		conn, buf, _ := http.NewResponseController(w).Hijack()
		buf.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort")
		buf.Flush()
		conn.Close()
	})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.record(r)
		mux.ServeHTTP(w, r)
	}))
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			s.opened.Add(1)
		case http.StateClosed, http.StateHijacked:
			s.closed.Add(1)
		}
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv.Listener.Close()
	srv.Listener = l
	if tls {
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	s.Server, s.port = srv, l.Addr().(*net.TCPAddr).Port
	return s
}

func httpGet(port intstr.IntOrString, path string, headers ...v1.HTTPHeader) *v1.ProbeHandler {
	return &v1.ProbeHandler{HTTPGet: &v1.HTTPGetAction{Port: port, Path: path, HTTPHeaders: headers}}
}

// webPort is the port the container names "web" in probeHTTP.
var webPort atomic.Int32

// passTimeout is the timeout of probes that are not about timing out: a
// busy machine, or qemu-user emulating TLS, can take seconds over what
// takes milliseconds.
const passTimeout = 20 * time.Second

func probeHTTP(t *testing.T, h *v1.ProbeHandler, podIP string, timeout time.Duration) (Result, string, error) {
	t.Helper()
	c := &v1.Container{Name: "app", Ports: []v1.ContainerPort{{Name: "web", ContainerPort: webPort.Load()}}}
	return Do(context.Background(), h, timeout, Target{PodIP: podIP, Container: c}, nil)
}

func TestHTTPProbeStatusCodes(t *testing.T) {
	s := newProbeServer(t, "127.0.0.1:0", false)
	for _, tc := range []struct {
		code    int
		want    Result
		wantMsg string
	}{
		{200, Success, ""},
		{204, Success, ""},
		{299, Success, ""},
		// A 3xx that is not followed counts as success, with the
		// kubelet's warning (a ProbeWarning event there).
		{300, Success, "Probe terminated redirects, Response body: body-300"},
		{304, Success, "Probe terminated redirects, Response body: "},
		{399, Success, "Probe terminated redirects, Response body: body-399"},
		{400, Failure, "HTTP probe failed with statuscode: 400"},
		{404, Failure, "HTTP probe failed with statuscode: 404"},
		{500, Failure, "HTTP probe failed with statuscode: 500"},
		{503, Failure, "HTTP probe failed with statuscode: 503"},
	} {
		res, msg, err := probeHTTP(t, httpGet(intstr.FromInt(s.port), "/status/"+strconv.Itoa(tc.code)), "127.0.0.1", passTimeout)
		if res != tc.want || msg != tc.wantMsg || err != nil {
			t.Errorf("%d: got %v %q %v, want %v %q", tc.code, res, msg, err, tc.want, tc.wantMsg)
		}
	}
}

func TestHTTPProbeRequest(t *testing.T) {
	s := newProbeServer(t, "127.0.0.1:0", false)
	webPort.Store(int32(s.port))
	hostPort := "127.0.0.1:" + strconv.Itoa(s.port)
	for _, tc := range []struct {
		name    string
		podIP   string
		action  v1.HTTPGetAction
		path    string // where the request lands
		wantURI string
		check   func(seen) string
	}{
		{"defaults", "127.0.0.1", v1.HTTPGetAction{Port: intstr.FromInt(s.port), Path: "/healthz"}, "/healthz", "/healthz",
			func(r seen) string {
				if r.host != hostPort || r.header.Get("User-Agent") != "kube-probe/1.37" || r.header.Get("Accept") != "*/*" {
					return fmt.Sprintf("host %q user agent %q accept %q", r.host, r.header.Get("User-Agent"), r.header.Get("Accept"))
				}
				// A fresh connection per probe, no compression.
				if !r.close || r.header.Get("Accept-Encoding") != "" {
					return fmt.Sprintf("connection close %t, accept-encoding %q", r.close, r.header.Get("Accept-Encoding"))
				}
				return ""
			}},
		{"headers given", "127.0.0.1", v1.HTTPGetAction{Port: intstr.FromInt(s.port), Path: "/h", HTTPHeaders: []v1.HTTPHeader{
			{Name: "Host", Value: "example.test"}, {Name: "x-custom", Value: "a"}, {Name: "X-Custom", Value: "b"},
			{Name: "User-Agent", Value: "mine"}, {Name: "Accept", Value: "application/json"}}}, "/h", "/h",
			func(r seen) string {
				if r.host != "example.test" || !slices.Equal(r.header["X-Custom"], []string{"a", "b"}) ||
					r.header.Get("User-Agent") != "mine" || r.header.Get("Accept") != "application/json" {
					return fmt.Sprintf("host %q headers %v", r.host, r.header)
				}
				return ""
			}},
		{"empty user agent and accept are sent as none", "127.0.0.1", v1.HTTPGetAction{Port: intstr.FromInt(s.port), Path: "/e",
			HTTPHeaders: []v1.HTTPHeader{{Name: "User-Agent"}, {Name: "Accept"}}}, "/e", "/e",
			func(r seen) string {
				if _, ua := r.header["User-Agent"]; ua || r.header["Accept"] != nil {
					return fmt.Sprintf("headers %v", r.header)
				}
				return ""
			}},
		{"path without a slash, with a query", "127.0.0.1", v1.HTTPGetAction{Port: intstr.FromInt(s.port), Path: "q?a=1&b=%2F"}, "/q", "/q?a=1&b=%2F", nil},
		{"named port", "127.0.0.1", v1.HTTPGetAction{Port: intstr.FromString("web"), Path: "/named"}, "/named", "/named", nil},
		{"host field over the pod IP", "192.0.2.1", v1.HTTPGetAction{Host: "127.0.0.1", Port: intstr.FromInt(s.port), Path: "/host"}, "/host", "/host", nil},
		{"scheme in capitals", "127.0.0.1", v1.HTTPGetAction{Scheme: v1.URISchemeHTTP, Port: intstr.FromInt(s.port), Path: "/caps"}, "/caps", "/caps", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, msg, err := probeHTTP(t, &v1.ProbeHandler{HTTPGet: &tc.action}, tc.podIP, passTimeout)
			if res != Success || err != nil {
				t.Fatalf("got %v %q %v, want Success", res, msg, err)
			}
			r := s.saw(tc.path)
			if r.uri != tc.wantURI {
				t.Errorf("request URI %q, want %q", r.uri, tc.wantURI)
			}
			if tc.check != nil {
				if problem := tc.check(r); problem != "" {
					t.Error(problem)
				}
			}
		})
	}
}

func TestHTTPProbeRedirects(t *testing.T) {
	s := newProbeServer(t, "127.0.0.1:0", false)
	sibling := newProbeServer(t, "127.0.0.1:0", false) // same host, another port
	other := newProbeServer(t, "127.0.0.2:0", false)   // another host
	for _, tc := range []struct {
		name       string
		path       string
		want       Result
		wantMsg    string // a prefix
		landed     *probeServer
		landedPath string
		hits       int // requests to landedPath
	}{
		{"same host", "/redirect?to=/status/204", Success, "", s, "/status/204", 1},
		{"same host, another port", "/redirect?to=" + sibling.URL + "/status/204", Success, "", sibling, "/status/204", 1},
		{"to a failing page", "/redirect?to=/status/503", Failure, "HTTP probe failed with statuscode: 503", s, "/status/503", 1},
		{"another host is not followed", "/redirect?to=" + other.URL + "/", Success,
			`Probe terminated redirects, Response body: <a href="http://127.0.0.2:`, other, "/", 0},
		{"9 hops", "/hops/9", Success, "", s, "/hops/0", 1},
		{"10 hops are too many", "/hops/10", Failure, `Get "/hops/0": stopped after 10 redirects`, s, "/hops/0", 0},
		{"a loop", "/loop", Failure, `Get "/loop": stopped after 10 redirects`, s, "/loop", 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.landed.saw(tc.landedPath).hits
			res, msg, err := probeHTTP(t, httpGet(intstr.FromInt(s.port), tc.path), "127.0.0.1", passTimeout)
			if res != tc.want || !strings.HasPrefix(msg, tc.wantMsg) || (tc.wantMsg == "" && msg != "") || err != nil {
				t.Errorf("got %v %q %v, want %v %q", res, msg, err, tc.want, tc.wantMsg)
			}
			if hits := tc.landed.saw(tc.landedPath).hits - before; hits != tc.hits {
				t.Errorf("%d requests to %s, want %d", hits, tc.landedPath, tc.hits)
			}
		})
	}
}

func TestHTTPProbeBodies(t *testing.T) {
	s := newProbeServer(t, "127.0.0.1:0", false)
	other := newProbeServer(t, "127.0.0.2:0", false)
	if res, msg, err := probeHTTP(t, httpGet(intstr.FromInt(s.port), "/big"), "127.0.0.1", passTimeout); res != Success || err != nil {
		t.Errorf("20 KiB body: %v %q %v", res, msg, err)
	}
	// A redirect's body is in the message, cut at 10 KiB.
	big := other.URL + "/" + strings.Repeat("x", 11<<10)
	res, msg, err := probeHTTP(t, httpGet(intstr.FromInt(s.port), "/redirect?to="+big), "127.0.0.1", passTimeout)
	if body, ok := strings.CutPrefix(msg, "Probe terminated redirects, Response body: "); res != Success || err != nil || !ok || len(body) != 10<<10 {
		t.Errorf("redirect with an 11 KiB body: %v %v, message of %d bytes", res, err, len(msg))
	}
	// 1xx answers before the real one are skipped.
	if res, msg, err := probeHTTP(t, httpGet(intstr.FromInt(s.port), "/early-hints"), "127.0.0.1", passTimeout); res != Success || err != nil {
		t.Errorf("103 then 200: %v %q %v", res, msg, err)
	}
	// A body cut short cannot be read: the kubelet discards such an attempt.
	if res, msg, err := probeHTTP(t, httpGet(intstr.FromInt(s.port), "/short"), "127.0.0.1", passTimeout); res != Unknown || err == nil {
		t.Errorf("short body: %v %q %v, want Unknown and an error", res, msg, err)
	}
}

func TestHTTPProbeFailsToConnect(t *testing.T) {
	s := newProbeServer(t, "127.0.0.1:0", false)
	tlsSrv := newProbeServer(t, "127.0.0.1:0", true)
	closed := closedPort(t)
	for _, tc := range []struct {
		name    string
		h       *v1.ProbeHandler
		wantMsg string
		maxTook time.Duration
	}{
		{"connection refused", httpGet(intstr.FromInt(closed), "/"),
			fmt.Sprintf(`Get "http://127.0.0.1:%d/": dial tcp 127.0.0.1:%d: connect: connection refused`, closed, closed), 10 * time.Second},
		// The kubelet's client has a Timeout; net/http words it so.
		{"timeout", httpGet(intstr.FromInt(s.port), "/slow"),
			fmt.Sprintf(`Get "http://127.0.0.1:%d/slow": context deadline exceeded (Client.Timeout exceeded while awaiting headers)`, s.port), 10 * time.Second},
		{"timeout over TLS", &v1.ProbeHandler{HTTPGet: &v1.HTTPGetAction{Scheme: v1.URISchemeHTTPS, Port: intstr.FromInt(tlsSrv.port), Path: "/slow"}},
			fmt.Sprintf(`Get "https://127.0.0.1:%d/slow": context deadline exceeded (Client.Timeout exceeded while awaiting headers)`, tlsSrv.port), 10 * time.Second},
		// A header the Transport refuses is refused in the same words.
		{"invalid header", httpGet(intstr.FromInt(s.port), "/", v1.HTTPHeader{Name: "X-Bad", Value: "a\nb"}),
			fmt.Sprintf(`Get "http://127.0.0.1:%d/": net/http: invalid header field value for "X-Bad"`, s.port), 10 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			// Only the timeout cases need the short timeout: on a busy
			// machine (or under qemu) 200 ms may not cover a refused dial.
			timeout := passTimeout
			if strings.HasPrefix(tc.name, "timeout") {
				timeout = 200 * time.Millisecond
			}
			res, msg, err := probeHTTP(t, tc.h, "127.0.0.1", timeout)
			if res != Failure || msg != tc.wantMsg || err != nil {
				t.Errorf("got %v %q %v, want Failure %q", res, msg, err, tc.wantMsg)
			}
			// Bounded by the timeout, not by the server's minute; generous
			// for a busy machine (and qemu).
			if took := time.Since(start); took > tc.maxTook {
				t.Errorf("took %s with a %s timeout", took, timeout)
			}
		})
	}
	if res, _, err := probeHTTP(t, httpGet(intstr.FromString("nope"), "/"), "127.0.0.1", passTimeout); res != Unknown || errString(err) != `strconv.Atoi: parsing "nope": invalid syntax` {
		t.Errorf("unknown port name: %v %v", res, err)
	}
}

func TestHTTPSProbe(t *testing.T) {
	s := newProbeServer(t, "127.0.0.1:0", true) // self-signed
	for _, tc := range []struct {
		path    string
		want    Result
		wantMsg string
	}{
		{"/status/200", Success, ""},
		{"/redirect?to=/status/204", Success, ""},
		{"/status/503", Failure, "HTTP probe failed with statuscode: 503"},
	} {
		h := &v1.ProbeHandler{HTTPGet: &v1.HTTPGetAction{Scheme: v1.URISchemeHTTPS, Port: intstr.FromInt(s.port), Path: tc.path}}
		if res, msg, err := probeHTTP(t, h, "127.0.0.1", passTimeout); res != tc.want || msg != tc.wantMsg || err != nil {
			t.Errorf("%s: got %v %q %v, want %v %q", tc.path, res, msg, err, tc.want, tc.wantMsg)
		}
	}
	if ua := s.saw("/status/200").header.Get("User-Agent"); ua != "kube-probe/1.37" {
		t.Errorf("user agent %q over TLS", ua)
	}
}

// TestHTTPProbeClosesEachConnection: every probe is a connection of its
// own, closed when the probe ends (the kubelet disables keep-alives).
func TestHTTPProbeClosesEachConnection(t *testing.T) {
	s := newProbeServer(t, "127.0.0.1:0", false)
	for _, path := range []string{"/", "/big", "/status/500", "/redirect?to=/", "/early-hints"} {
		probeHTTP(t, httpGet(intstr.FromInt(s.port), path), "127.0.0.1", passTimeout)
	}
	deadline := time.Now().Add(30 * time.Second)
	for s.closed.Load() < 6 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if s.opened.Load() != 6 || s.closed.Load() != 6 {
		t.Errorf("%d connections opened and %d closed by 5 probes (one redirect), want 6 and 6", s.opened.Load(), s.closed.Load())
	}
}

// TestOneShotWritesWhatTheTransportWrites compares, line by line, the
// request oneShot writes with the one the kubelet's Transport writes.
func TestOneShotWritesWhatTheTransportWrites(t *testing.T) {
	l, port := listen(t, "127.0.0.1:0")
	requests := make(chan []string, 2)
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			r := bufio.NewReader(conn)
			var lines []string
			for {
				line, err := r.ReadString('\n')
				if err != nil || line == "\r\n" {
					break
				}
				lines = append(lines, line)
			}
			io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
			conn.Close()
			slices.Sort(lines[1:])
			requests <- lines
		}
	}()
	h := &v1.HTTPGetAction{Port: intstr.FromInt(port), Path: "/p?q=1", HTTPHeaders: []v1.HTTPHeader{
		{Name: "Host", Value: "example.test"}, {Name: "X-A", Value: "1"}, {Name: "x-a", Value: "2"}, {Name: "X-Empty"}}}
	var got [][]string
	for _, rt := range []http.RoundTripper{oneShot{}, probeTransport} {
		ctx, cancel := context.WithTimeout(context.Background(), passTimeout)
		req, err := newRequest(ctx, h, Target{PodIP: "127.0.0.1"}, "probe")
		if err != nil {
			t.Fatal(err)
		}
		resp, err := rt.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		cancel()
		got = append(got, <-requests)
	}
	if !slices.Equal(got[0], got[1]) {
		t.Errorf("oneShot wrote\n%q\nthe Transport\n%q", got[0], got[1])
	}
}

func BenchmarkHTTPProbe(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	h := httpGet(intstr.FromInt(port), "/healthz")
	tgt := Target{PodIP: "127.0.0.1", Container: &v1.Container{Name: "app"}}
	b.ReportAllocs()
	for b.Loop() {
		if res, msg, err := Do(context.Background(), h, time.Second, tgt, nil); res != Success {
			b.Fatal(res, msg, err)
		}
	}
}
