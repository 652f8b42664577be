package kubeapi

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// stalledWatches opens n watches over raw connections that never read.
func stalledWatches(t *testing.T, addr string, n int) []net.Conn {
	t.Helper()
	var conns []net.Conn
	for range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.(*net.TCPConn).SetReadBuffer(4096)
		fmt.Fprintf(c, "GET /api/v1/pods?watch=true HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n", testCreds.ViewToken)
		conns = append(conns, c)
		t.Cleanup(func() { c.Close() })
	}
	return conns
}

func heapInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// A watch whose client stopped reading ends once a write waits longer than
// the write timeout, and holds none of its changes: memory is bounded by
// the clients that read, not by those that stall.
func TestStalledWatchEnds(t *testing.T) {
	be := &fakeBackend{pods: []v1.Pod{testPod("default", "a")}}
	s := New(testCreds)
	s.writeTimeout = time.Second
	s.Ready(be, nil)
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	const watchers = 3
	stalledWatches(t, srv.Listener.Addr().String(), watchers)
	for s.pods.store.watcherCount() < watchers {
		time.Sleep(10 * time.Millisecond)
	}
	before := heapInUse()
	for i := range 600 { // 38 MiB of changes: far more than the sockets buffer
		p := testPod("default", "a")
		p.Annotations = map[string]string{"blob": strings.Repeat(fmt.Sprint(i%10), 64<<10)}
		p.ResourceVersion = fmt.Sprint(i + 1)
		be.set([]v1.Pod{p}, nil)
		s.sync()
	}
	waitGoroutinesGone(t, "kubeapi.(*resource[...]).serveWatch")
	if n := s.pods.store.watcherCount(); n != 0 {
		t.Errorf("%d stalled watches still registered", n)
	}
	if grew := heapInUse() - before; grew > 8<<20 {
		t.Errorf("the stalled watches' handlers ended, yet the heap grew by %d MiB", grew>>20)
	}
}

// A watch that waits for changes longer than the write timeout lives on:
// the deadline bounds writes, not the waits between them, over HTTP/1.1
// and HTTP/2 (whose deadline ends the stream when it passes, written to or
// not).
func TestIdleWatchOutlivesTheWriteTimeout(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("HTTP/2 %t", h2), func(t *testing.T) {
			be := &fakeBackend{pods: []v1.Pod{phasePod("a", v1.PodPending)}}
			s := New(testCreds)
			s.writeTimeout = 100 * time.Millisecond
			s.Ready(be, nil)
			srv := httptest.NewUnstartedServer(s)
			srv.EnableHTTP2 = h2
			srv.StartTLS()
			t.Cleanup(srv.Close)
			ch := watchEvents(t, srv, "/api/v1/pods?watch=true", "")
			if typ, _ := next(t, ch); typ != "ADDED" {
				t.Fatalf("first event %s", typ)
			}
			time.Sleep(10 * s.writeTimeout)
			be.set([]v1.Pod{phasePod("a", v1.PodRunning)}, nil)
			if typ, p := next(t, ch); typ != "MODIFIED" || p.Status.Phase != v1.PodRunning {
				t.Fatalf("after waiting: %s %s", typ, p.Status.Phase)
			}
			// The answer after an idle while is written too.
			if resp := get(t, srv, "/api/v1/pods", ""); resp.StatusCode != http.StatusOK {
				t.Fatalf("list: %s", resp.Status)
			}
		})
	}
}

// A watch without timeoutSeconds ends after the server's own timeout, so
// that the client watches again.
func TestWatchEndsAfterServerTimeout(t *testing.T) {
	s := New(testCreds)
	s.watchTimeout = func() time.Duration { return 100 * time.Millisecond }
	s.Ready(&fakeBackend{pods: []v1.Pod{phasePod("a", v1.PodPending)}}, nil)
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	ch := watchEvents(t, srv, "/api/v1/pods?watch=true", "")
	next(t, ch)
	select {
	case _, ok := <-ch:
		if ok {
			t.Fatal("an event, want the end")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the watch did not end")
	}
}

// As the API server's: from minWatchTimeout to twice it, spread out.
func TestRandomWatchTimeout(t *testing.T) {
	seen := map[time.Duration]bool{}
	for range 1000 {
		d := randomWatchTimeout()
		if d < minWatchTimeout || d >= 2*minWatchTimeout {
			t.Fatalf("%s is outside [%s, %s)", d, minWatchTimeout, 2*minWatchTimeout)
		}
		seen[d] = true
	}
	if len(seen) < 900 {
		t.Errorf("only %d distinct timeouts in 1000", len(seen))
	}
}

// blockingStreams holds every stream request until its client goes.
type blockingStreams struct{}

func (blockingStreams) hold(w http.ResponseWriter, r *http.Request) {
	w.WriteHeader(http.StatusOK)
	http.NewResponseController(w).Flush()
	<-r.Context().Done()
}
func (b blockingStreams) Log(w http.ResponseWriter, r *http.Request, _, _ string)    { b.hold(w, r) }
func (b blockingStreams) Exec(w http.ResponseWriter, r *http.Request, _, _ string)   { b.hold(w, r) }
func (b blockingStreams) Attach(w http.ResponseWriter, r *http.Request, _, _ string) { b.hold(w, r) }
func (b blockingStreams) PortForward(w http.ResponseWriter, r *http.Request, _, _ string) {
	b.hold(w, r)
}

// Each token may hold a few watches, follows and exec, attach or
// port-forward sessions at once; past that the API answers 429 with a
// Status and Retry-After, as the API server does past its max-in-flight.
// Other kinds, other tokens and short requests are not held up, and a
// request that ends frees its place.
func TestLongRunningRequestsCappedPerToken(t *testing.T) {
	var srv *httptest.Server
	start := func() {
		s := New(testCreds)
		s.limits = newLimiter([nLongRunning]int{watches: 2, follows: 2, remoteCalls: 2})
		s.Ready(&fakeBackend{pods: []v1.Pod{testPod("default", "web")}}, blockingStreams{})
		srv = httptest.NewServer(s)
		t.Cleanup(srv.Close)
	}
	const pod = "/api/v1/namespaces/default/pods/web/"
	open := func(method, path, token string) (*http.Response, context.CancelFunc) {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		req, _ := http.NewRequestWithContext(ctx, method, srv.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp, cancel
	}
	for _, tt := range []struct {
		kind, method, path, token string
	}{
		{"watch", "GET", "/api/v1/pods?watch=true", testCreds.ViewToken},
		{"follow", "GET", pod + "log?follow=true", testCreds.ViewToken},
		{"exec", "POST", pod + "exec?command=sh", testCreds.AdminToken},
		{"attach", "POST", pod + "attach", testCreds.AdminToken},
		{"port-forward", "GET", pod + "portforward", testCreds.AdminToken},
	} {
		t.Run(tt.kind, func(t *testing.T) {
			start() // exec, attach and port-forward share a cap
			var cancels []context.CancelFunc
			for range 2 {
				resp, cancel := open(tt.method, tt.path, tt.token)
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("within the cap: %s", resp.Status)
				}
				cancels = append(cancels, cancel)
			}
			resp, _ := open(tt.method, tt.path, tt.token)
			if resp.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("past the cap: %s", resp.Status)
			}
			var st metav1.Status
			json.NewDecoder(resp.Body).Decode(&st)
			if st.Reason != metav1.StatusReasonTooManyRequests ||
				resp.Header.Get("Retry-After") != "1" || st.Details == nil || st.Details.RetryAfterSeconds != 1 {
				t.Fatalf("past the cap: %s, Retry-After %q, %+v", resp.Status, resp.Header.Get("Retry-After"), st)
			}
			t.Logf("%s", st.Message)
			if tt.token == testCreds.ViewToken {
				if resp, _ := open(tt.method, tt.path, testCreds.AdminToken); resp.StatusCode != http.StatusOK {
					t.Errorf("the other token: %s", resp.Status)
				}
			}
			if resp, _ := open("GET", "/api/v1/pods", tt.token); resp.StatusCode != http.StatusOK {
				t.Errorf("a list: %s", resp.Status)
			}
			cancels[0]()
			deadline := time.Now().Add(30 * time.Second)
			for {
				resp, _ := open(tt.method, tt.path, tt.token)
				if resp.StatusCode == http.StatusOK {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("a place was freed, yet: %s", resp.Status)
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
	// Logs that do not follow end by themselves and are not counted.
	start()
	for range 3 {
		if resp, _ := open("GET", pod+"log", testCreds.ViewToken); resp.StatusCode != http.StatusOK {
			t.Errorf("a log read past the follow cap: %s", resp.Status)
		}
	}
}

// serveTLS serves s on a real listener as noderun does, and returns a
// client for it (HTTP/2 when h2).
func serveTLS(t *testing.T, s *Server, h2 bool) (url string, client *http.Client, tlsCfg *tls.Config) {
	t.Helper()
	creds, err := LoadCredentials(t.TempDir(), Hosts("127.0.0.1"), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	creds.ViewToken, creds.AdminToken = testCreds.ViewToken, testCreds.AdminToken
	s.creds = creds
	l, err := Listen("127.0.0.1", 0)
	if err != nil {
		t.Fatal(err)
	}
	stop := s.Serve(l)
	t.Cleanup(func() { stop() })
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(creds.CAPEM)
	tlsCfg = &tls.Config{RootCAs: pool}
	return ServerURL(l.Addr()), &http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg, ForceAttemptHTTP2: h2}}, tlsCfg
}

// Headers are bounded well below Go's 1 MiB default, over HTTP/1.1 and
// HTTP/2.
func TestOversizedHeadersRefused(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		s := New(testCreds)
		s.Ready(&fakeBackend{}, nil)
		url, client, _ := serveTLS(t, s, h2)
		req, _ := http.NewRequest("GET", url+"/api/v1/pods", nil)
		req.Header.Set("Authorization", "Bearer "+testCreds.ViewToken)
		req.Header.Set("X-Padding", strings.Repeat("x", 100<<10))
		resp, err := client.Do(req)
		if err != nil {
			if h2 {
				continue // HTTP/2 may refuse it as a stream or connection error
			}
			t.Fatalf("HTTP/2 %t: %v", h2, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("HTTP/2 %t: 100 KiB of headers: %s, want 431", h2, resp.Status)
		}
	}
}

// Past the connection cap, a new connection waits until one closes.
func TestConnectionCap(t *testing.T) {
	s := New(testCreds)
	s.maxConns = 2
	s.Ready(&fakeBackend{}, nil)
	url, _, tlsCfg := serveTLS(t, s, false)
	addr := strings.TrimPrefix(url, "https://")
	var conns []*tls.Conn
	for range s.maxConns {
		c, err := tls.Dial("tcp", addr, tlsCfg) // the handshake needs the server
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		t.Cleanup(func() { c.Close() })
	}
	d := &net.Dialer{Timeout: time.Second}
	if c, err := tls.DialWithDialer(d, "tcp", addr, tlsCfg); err == nil {
		c.Close()
		t.Fatal("a connection past the cap was served")
	}
	conns[0].Close()
	d.Timeout = 30 * time.Second
	c, err := tls.DialWithDialer(d, "tcp", addr, tlsCfg)
	if err != nil {
		t.Fatalf("a connection closed, yet: %v", err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET /api/v1/pods HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n", testCreds.ViewToken)
	if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("served: %v %v", resp, err)
	}
}

// Request bodies are never read; over HTTP/2, what clients send into them
// is held only up to the smallest flow-control window, however many
// connections send one.
func TestRequestBodiesHeldBounded(t *testing.T) {
	s := New(testCreds)
	s.limits = newLimiter([nLongRunning]int{watches: 100})
	s.Ready(&fakeBackend{}, nil)
	url, _, tlsCfg := serveTLS(t, s, true)
	const conns = 32
	before := heapInUse()
	for range conns {
		// A transport each: a connection each.
		client := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg, ForceAttemptHTTP2: true}}
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		body, w := io.Pipe()
		go func() { // 64 MiB, as far as the server lets it go
			buf := make([]byte, 32<<10)
			for range 2048 {
				if _, err := w.Write(buf); err != nil {
					return
				}
			}
			w.Close()
		}()
		t.Cleanup(func() { body.Close() })
		req, _ := http.NewRequestWithContext(ctx, "GET", url+"/api/v1/pods?watch=true", body)
		req.Header.Set("Authorization", "Bearer "+testCreds.ViewToken)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.ProtoMajor != 2 || resp.StatusCode != http.StatusOK {
			t.Fatalf("%s %s", resp.Proto, resp.Status)
		}
		t.Cleanup(func() { resp.Body.Close() })
	}
	time.Sleep(time.Second) // for the clients to send what they may
	grew := heapInUse() - before
	t.Logf("%d HTTP/2 watches with endless bodies: heap grew by %d KiB", conns, grew>>10)
	// The clients' own buffers are about 512 KiB each; with Go's default
	// 1 MiB windows the heap grew by 50 MiB.
	if grew > 32<<20 {
		t.Errorf("the heap grew by %d MiB", grew>>20)
	}
}
