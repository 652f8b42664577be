package kubeapi

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// fakeBackend serves set pods and events; set bumps the version and
// wakes watches as the engine does.
type fakeBackend struct {
	mu      sync.Mutex
	pods    []v1.Pod
	events  []v1.Event
	version uint64
	changed chan struct{}
}

func (f *fakeBackend) Pods() []v1.Pod {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.pods)
}

func (f *fakeBackend) Events() []v1.Event {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.events)
}

func (f *fakeBackend) Changes() (uint64, <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.changed == nil {
		f.changed = make(chan struct{})
	}
	return f.version, f.changed
}

func (f *fakeBackend) Node(context.Context) *v1.Node {
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node1"}}
}

func (f *fakeBackend) SourceErrors() map[string][]error {
	return map[string][]error{"file:/etc/pods": {errors.New("x.yaml: bad")}}
}

func (f *fakeBackend) set(pods []v1.Pod, events []v1.Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pods, f.events = pods, events
	f.version++
	if f.changed != nil {
		close(f.changed)
		f.changed = nil
	}
}

// fakeStreams records which subresource was served for which pod.
type fakeStreams struct{ got []string }

func (f *fakeStreams) serve(w http.ResponseWriter, what, ns, pod string) {
	f.got = append(f.got, what+" "+ns+"/"+pod)
	w.WriteHeader(http.StatusTeapot)
}
func (f *fakeStreams) Log(w http.ResponseWriter, _ *http.Request, ns, pod string) {
	f.serve(w, "log", ns, pod)
}
func (f *fakeStreams) Exec(w http.ResponseWriter, _ *http.Request, ns, pod string) {
	f.serve(w, "exec", ns, pod)
}
func (f *fakeStreams) Attach(w http.ResponseWriter, _ *http.Request, ns, pod string) {
	f.serve(w, "attach", ns, pod)
}
func (f *fakeStreams) PortForward(w http.ResponseWriter, _ *http.Request, ns, pod string) {
	f.serve(w, "portforward", ns, pod)
}

var testCreds = &Credentials{ViewToken: strings.Repeat("v", 40), AdminToken: strings.Repeat("a", 40)}

func testPod(ns, name string) v1.Pod {
	return v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name)}}
}

func newTestServer(streams Streams) *Server {
	s := New(testCreds)
	s.Ready(&fakeBackend{pods: []v1.Pod{testPod("default", "web-e2e")}}, streams)
	return s
}

// do sends a request with the token (none when empty) and decodes a
// Status answer.
func do(t *testing.T, h http.Handler, method, path, token string, hdr ...string) (int, metav1.Status) {
	t.Helper()
	r := httptest.NewRequest(method, path, nil)
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	var st metav1.Status
	if w.Code >= 400 && w.Code != http.StatusTeapot { // the fake streams answer 418
		if err := json.Unmarshal(w.Body.Bytes(), &st); err != nil || st.Kind != "Status" {
			t.Fatalf("%s %s: %d with %q, want a metav1.Status", method, path, w.Code, w.Body)
		}
		if int(st.Code) != w.Code {
			t.Errorf("%s %s: Status code %d in a %d answer", method, path, st.Code, w.Code)
		}
	}
	return w.Code, st
}

func TestAccess(t *testing.T) {
	view, admin := testCreds.ViewToken, testCreds.AdminToken
	const pod = "/api/v1/namespaces/default/pods/web-e2e"
	tests := []struct {
		name, method, path, token string
		hdr                       []string
		want                      int
		wantReason                metav1.StatusReason
	}{
		{"no token", "GET", "/api/v1/pods", "", nil, 401, metav1.StatusReasonUnauthorized},
		{"wrong token", "GET", "/api/v1/pods", strings.Repeat("x", 40), nil, 401, metav1.StatusReasonUnauthorized},
		{"token prefix", "GET", "/api/v1/pods", view[:20], nil, 401, metav1.StatusReasonUnauthorized},
		{"no token, exec", "POST", pod + "/exec", "", nil, 401, metav1.StatusReasonUnauthorized},
		{"view reads", "GET", "/api/v1/pods", view, nil, 200, ""},
		{"view reads a pod", "GET", pod, view, nil, 200, ""},
		{"view reads logs", "GET", pod + "/log", view, nil, http.StatusTeapot, ""},
		{"view exec", "POST", pod + "/exec", view, nil, 403, metav1.StatusReasonForbidden},
		{"view exec GET", "GET", pod + "/exec", view, nil, 403, metav1.StatusReasonForbidden},
		{"view attach", "POST", pod + "/attach", view, nil, 403, metav1.StatusReasonForbidden},
		{"view portforward", "POST", pod + "/portforward", view, nil, 403, metav1.StatusReasonForbidden},
		// The route matches escaped segments: a check that parsed the
		// decoded path again saw no exec here.
		{"view exec, escaped slash in the name", "POST", pod + "%2Fx/exec", view, nil, 403, metav1.StatusReasonForbidden},
		{"view attach, escaped slash in the namespace", "GET", "/api/v1/namespaces/a%2Fb/pods/web-e2e/attach", view, nil, 403, metav1.StatusReasonForbidden},
		{"admin exec", "POST", pod + "/exec", admin, nil, http.StatusTeapot, ""},
		{"admin attach", "GET", pod + "/attach", admin, nil, http.StatusTeapot, ""},
		{"admin portforward", "POST", pod + "/portforward", admin, nil, http.StatusTeapot, ""},
		{"admin exec, no such pod", "POST", "/api/v1/namespaces/default/pods/nope/exec", admin, nil, 404, metav1.StatusReasonNotFound},
		{"browser", "GET", "/api/v1/pods", admin, []string{"Origin", "http://evil.example"}, 403, metav1.StatusReasonForbidden},
		{"delete pod", "DELETE", pod, admin, nil, 405, metav1.StatusReasonMethodNotAllowed},
		{"create pod", "POST", "/api/v1/namespaces/default/pods", admin, nil, 405, metav1.StatusReasonMethodNotAllowed},
		{"patch pod", "PATCH", pod, view, nil, 405, metav1.StatusReasonMethodNotAllowed},
		{"unknown", "GET", "/api/v1/secrets", view, nil, 404, metav1.StatusReasonNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			streams := &fakeStreams{}
			code, st := do(t, newTestServer(streams), tt.method, tt.path, tt.token, tt.hdr...)
			if code != tt.want || st.Reason != tt.wantReason {
				t.Fatalf("%s %s: %d %s (%s), want %d %s", tt.method, tt.path, code, st.Reason, st.Message, tt.want, tt.wantReason)
			}
			if code == http.StatusTeapot && (len(streams.got) != 1 || !strings.HasSuffix(streams.got[0], " default/web-e2e")) {
				t.Errorf("streams served %v", streams.got)
			}
			if code != http.StatusTeapot && len(streams.got) != 0 {
				t.Errorf("refused, yet streams served %v", streams.got)
			}
		})
	}
}

func TestWritesSayManifests(t *testing.T) {
	_, st := do(t, newTestServer(nil), "DELETE", "/api/v1/namespaces/default/pods/web-e2e", testCreds.AdminToken)
	if !strings.Contains(st.Message, "manifests") {
		t.Errorf("message %q does not say static pods change through their manifests", st.Message)
	}
}

func TestNoStreamsIsNotFound(t *testing.T) {
	code, _ := do(t, newTestServer(nil), "POST", "/api/v1/namespaces/default/pods/web-e2e/exec", testCreds.AdminToken)
	if code != http.StatusNotFound {
		t.Fatalf("exec without Streams: %d, want 404", code)
	}
}

func TestUnavailableUntilReady(t *testing.T) {
	s := New(testCreds)
	s.SetWaiting("waiting for containerd: no socket")
	code, st := do(t, s, "GET", "/api/v1/pods", testCreds.ViewToken)
	if code != http.StatusServiceUnavailable || !strings.Contains(st.Message, "waiting for containerd") {
		t.Fatalf("before Ready: %d %q, want 503 saying what it waits for", code, st.Message)
	}
	// Still no answer without a token.
	if code, _ := do(t, s, "GET", "/api/v1/pods", ""); code != http.StatusUnauthorized {
		t.Fatalf("before Ready without a token: %d, want 401", code)
	}
}

// Over a real listener: TLS with the generated CA, and plain HTTP refused.
func TestServeTLSOnly(t *testing.T) {
	creds, err := LoadCredentials(t.TempDir(), Hosts("127.0.0.1"), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	s := New(creds)
	s.Ready(&fakeBackend{}, nil)
	l, err := Listen("127.0.0.1", 0)
	if err != nil {
		t.Fatal(err)
	}
	stop := s.Serve(l)
	defer stop()
	url := ServerURL(l.Addr())

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(creds.CAPEM)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	req, _ := http.NewRequest("GET", url+"/api/v1/pods", nil)
	req.Header.Set("Authorization", "Bearer "+creds.ViewToken)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("HTTPS with the CA: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("HTTPS: %s", resp.Status)
	}

	plain := "http" + strings.TrimPrefix(url, "https")
	req, _ = http.NewRequest("GET", plain+"/api/v1/pods", nil)
	req.Header.Set("Authorization", "Bearer "+creds.ViewToken)
	resp, err = (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK || strings.Contains(string(body), "PodList") {
			t.Fatalf("plain HTTP was served: %s %s", resp.Status, body)
		}
	}
}
