package kubeapi

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/noderun/noderun/internal/execio"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/streaming/pkg/httpstream"
)

// Fuzz targets for every request parser of the API. `go test` runs their
// seeds; `go test -fuzz FuzzX ./kubeapi` explores.

// The exec and attach query, as kubectl sends it.
func FuzzRemoteOptions(f *testing.F) {
	for _, seed := range []string{
		"command=sh&stdin=true&stdout=true&stderr=true&tty=true",
		"command=ls&stdout=true",
		"stdout=1&stderr=0",
		"stdin=maybe",
		"",
		"tty=true&stderr=true&stdout=%zz",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		q, _ := url.ParseQuery(raw)
		o, st := parseRemoteOptions(q)
		if st != nil {
			checkStatus(t, st, http.StatusBadRequest)
			return
		}
		if !o.stdin && !o.stdout && !o.stderr {
			t.Errorf("%q: accepted without a stream", raw)
		}
		if o.tty && o.stderr {
			t.Errorf("%q: a terminal with stderr", raw)
		}
	})
}

// The pods/log query (PodLogOptions).
func FuzzLogOptions(f *testing.F) {
	for _, seed := range []string{
		"follow=true&tailLines=10&timestamps=true&container=app",
		"previous=true&limitBytes=100",
		"sinceSeconds=3600",
		"sinceTime=2026-01-02T03:04:05Z",
		"sinceSeconds=1&sinceTime=2026-01-02T03:04:05Z",
		"tailLines=9223372036854775807&sinceSeconds=9223372036854775807",
		"tailLines=-1&limitBytes=0&follow=maybe",
	} {
		f.Add(seed)
	}
	now := time.Date(2026, 11, 27, 0, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, raw string) {
		q, _ := url.ParseQuery(raw)
		o, _, st := logOptions(q, now)
		if st != nil {
			checkStatus(t, st, http.StatusBadRequest)
			return
		}
		if o.TailLines < -1 || int64(o.TailLines) > 1<<31 || o.LimitBytes < 0 {
			t.Errorf("%q: tailLines %d, limitBytes %d", raw, o.TailLines, o.LimitBytes)
		}
		if !o.Since.IsZero() && q.Get("sinceSeconds") != "" && o.Since.After(now) {
			t.Errorf("%q: since %s is after now", raw, o.Since)
		}
	})
}

// List and watch options: selectors, watch, resourceVersion, timeoutSeconds,
// includeObject and the Accept header, for pods and events.
func FuzzListQuery(f *testing.F) {
	for _, seed := range []struct{ query, accept string }{
		{"labelSelector=app%3Dweb%2Ctier+in+%28a%2Cb%29%2C%21legacy", ""},
		{"fieldSelector=status.phase%3DRunning%2Cspec.nodeName%21%3Dn1", "application/json"},
		{"fieldSelector=involvedObject.name%3Dweb", tableAccept},
		{"watch=true&resourceVersion=12&timeoutSeconds=300&allowWatchBookmarks=true", ""},
		{"watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan", ""},
		{"includeObject=Object", tableAccept},
		{"labelSelector=%28%28%28&fieldSelector=a%3D%3D%3Db", "text/html;q=0.1, */*;as=Table"},
		{"timeoutSeconds=99999999999&watch=yes", ";;;"},
	} {
		f.Add(seed.query, seed.accept)
	}
	s := New(testCreds)
	f.Fuzz(func(t *testing.T, raw, accept string) {
		for _, parse := range []func(*http.Request) (*query, *metav1.Status){s.pods.parse, s.events.parse} {
			r := httptest.NewRequest("GET", "/api/v1/pods", nil)
			r.URL.RawQuery = raw
			r.Header.Set("Accept", accept)
			q, st := parse(r)
			if st != nil {
				if st.Code != http.StatusBadRequest && st.Code != http.StatusNotAcceptable {
					t.Errorf("%q (Accept %q): %d", raw, accept, st.Code)
				}
				checkStatus(t, st, int(st.Code))
				continue
			}
			if q.labels == nil || q.fields == nil || q.timeout < 0 {
				t.Errorf("%q: %+v", raw, q)
			}
		}
	})
}

// Any request, with either token, through the whole handler (watches
// excepted: they last): answers are JSON Status errors, the view token
// never reaches exec, attach or port-forward, and the path parsing for
// messages (resourceOf) holds.
func FuzzServeRequest(f *testing.F) {
	for _, seed := range []struct {
		method, path string
		admin        bool
	}{
		{"GET", "/api/v1/namespaces/default/pods/web-e2e", false},
		{"GET", "/api/v1/namespaces/default/pods/web-e2e/log?container=app", false},
		{"POST", "/api/v1/namespaces/default/pods/web-e2e/exec?command=ls&stdout=true", true},
		{"POST", "/api/v1/namespaces/default/pods/web-e2e%2Fx/exec", false},
		{"GET", "/api/v1/namespaces/a%2Fb/pods/web-e2e/portforward?ports=80", false},
		{"DELETE", "/api/v1/namespaces/default/pods/web-e2e/status", true},
		{"PATCH", "/api/v1/nodes/node1", false},
		{"GET", "/api/v1/nodes?fieldSelector=metadata.name%3Dnode1", false},
		{"GET", "/apis", false},
		{"GET", "/api/v1/events?fieldSelector=reason%3DFailed", false},
		{"GET", "//api/v1/../v1/pods/", false},
	} {
		f.Add(seed.method, seed.path, seed.admin)
	}
	f.Fuzz(func(t *testing.T, method, target string, admin bool) {
		if !strings.HasPrefix(target, "/") {
			target = "/" + target
		}
		u, err := url.ParseRequestURI(target)
		if err != nil || !validMethod(method) {
			return
		}
		q := u.Query()
		if q.Has("watch") {
			return // a watch lasts until its client goes
		}
		streams := &fakeStreams{}
		s := newTestServer(streams)
		token := testCreds.ViewToken
		if admin {
			token = testCreds.AdminToken
		}
		r := httptest.NewRequest("GET", "/", nil)
		r.Method, r.URL, r.RequestURI = method, u, target
		r.Header.Set("Authorization", "Bearer "+token)
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		if !admin {
			for _, got := range streams.got {
				if !strings.HasPrefix(got, "log ") {
					t.Errorf("%s %q: the view token reached %s", method, target, got)
				}
			}
		}
		if w.Code >= 400 && w.Code != http.StatusTeapot {
			var st metav1.Status
			if err := json.Unmarshal(w.Body.Bytes(), &st); err != nil || st.Kind != "Status" || int(st.Code) != w.Code {
				t.Errorf("%s %q: %d with %q", method, target, w.Code, w.Body)
			}
		}
		_ = resourceOf(u.Path)
	})
}

func validMethod(m string) bool {
	return m != "" && strings.IndexFunc(m, func(r rune) bool { return r <= ' ' || r >= 0x7f || strings.ContainsRune("()<>@,;:\\\"/[]?={}", r) }) < 0
}

// fakeStream is a port-forward stream with the client's headers.
type fakeStream struct {
	h  http.Header
	id uint32
}

func (s *fakeStream) Read([]byte) (int, error)    { return 0, io.EOF }
func (s *fakeStream) Write(p []byte) (int, error) { return len(p), nil }
func (s *fakeStream) Close() error                { return nil }
func (s *fakeStream) Reset() error                { return nil }
func (s *fakeStream) Headers() http.Header        { return s.h }
func (s *fakeStream) Identifier() uint32          { return s.id }

// closedConn is a port-forward session that has ended.
type closedConn struct{ httpstream.Connection }

func (closedConn) CloseChan() <-chan bool {
	ch := make(chan bool)
	close(ch)
	return ch
}

// A port-forward stream's headers: its port, type and request ID.
func FuzzPortStream(f *testing.F) {
	for _, seed := range []struct {
		port, typ, id string
		n             uint32
	}{
		{"8080", "data", "0", 3},
		{"80", "error", "", 1},
		{"0", "data", "1", 5},
		{"65536", "error", "x", 7},
		{"+80", "data", "", 2},
		{"08080", "resize", "", 9},
	} {
		f.Add(seed.port, seed.typ, seed.id, seed.n)
	}
	f.Fuzz(func(t *testing.T, port, typ, id string, n uint32) {
		h := http.Header{}
		h.Set(portHeader, port)
		h.Set(streamTypeHeader, typ)
		h.Set(requestIDHeader, id)
		st := &fakeStream{h: h, id: n}
		if checkPortStream(st) != nil {
			return
		}
		p, err := strconv.Atoi(h.Get(portHeader))
		if err != nil || p < 1 || p > 65535 {
			t.Errorf("port %q accepted", port)
		}
		if typ := h.Get(streamTypeHeader); typ != streamTypeData && typ != streamTypeError {
			t.Errorf("stream type %q accepted", typ)
		}
		// Pairing by request ID (or stream ID) never panics.
		fw := (&StreamServer{}).newForwarder(&v1.Pod{})
		fw.conn = closedConn{}
		fw.add(t.Context(), st)
		fw.end()
	})
}

// The terminal size messages of a resize stream.
func FuzzReadResizes(f *testing.F) {
	for _, seed := range []string{
		`{"Width":80,"Height":24}`,
		`{"Width":80,"Height":24}` + "\n" + `{"Width":120,"Height":40}`,
		`{"Width":-1}`,
		`{"Width":"`,
		`[1,2]{}null`,
		strings.Repeat(" ", 10000) + `{}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		out := make(chan execio.TerminalSize)
		go readResizes(bytes.NewReader(b), out, nil)
		n := 0
		for range out {
			n++
		}
		if n > len(b)/2 {
			t.Errorf("%d sizes from %d bytes", n, len(b))
		}
	})
}

// checkStatus fails unless st is an API error answer with code.
func checkStatus(t *testing.T, st *metav1.Status, code int) {
	t.Helper()
	if st.Kind != "Status" || int(st.Code) != code || st.Message == "" {
		t.Errorf("status %+v, want a %d with a message", st, code)
	}
}
