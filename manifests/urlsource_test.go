package manifests

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// server is an httptest server whose next answer the test sets.
type server struct {
	*httptest.Server
	mu      sync.Mutex
	respond http.HandlerFunc
	got     []http.Header // request headers, in order
}

func newServer(t *testing.T) *server {
	s := &server{}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

func (s *server) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.got = append(s.got, r.Header.Clone())
	respond := s.respond
	s.mu.Unlock()
	respond(w, r)
}

func (s *server) set(h http.HandlerFunc) { s.mu.Lock(); s.respond = h; s.mu.Unlock() }

func (s *server) lastHeader() http.Header {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.got[len(s.got)-1]
}

// body answers with content and the given headers (name, value pairs); an
// If-None-Match equal to the ETag gets 304, as a real server would answer.
func body(content string, headers ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i < len(headers); i += 2 {
			w.Header().Set(headers[i], headers[i+1])
		}
		if etag := w.Header().Get("ETag"); etag != "" && r.Header.Get("If-None-Match") == etag {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		w.Write([]byte(content))
	}
}

func newTestURLRun(t *testing.T, rawURL string, opts ...URLOption) *urlRun {
	t.Helper()
	s, err := NewURLSource(rawURL, "node1", opts...)
	if err != nil {
		t.Fatal(err)
	}
	return &urlRun{URLSource: s}
}

func pollSummary(r *urlRun) string {
	r.poll(context.Background())
	snap, _ := r.snapshot()
	return staleSummary(snap)
}

// Each step is one poll against what the server now answers.
func TestURLSourcePoll(t *testing.T) {
	srv := newServer(t)
	r := newTestURLRun(t, srv.URL+"/pods")
	u := srv.URL + "/pods"
	podList := `{"apiVersion":"v1","kind":"PodList","items":[` +
		`{"metadata":{"name":"a"},"spec":{"containers":[{"name":"c","image":"nginx:a"}]}}]}`
	steps := []struct {
		name        string
		respond     http.HandlerFunc
		want        string
		wantHeaders map[string]string // sent by the source
	}{
		{"first answer", body(manifest("web", "nginx:1"), "ETag", `"v1"`),
			"web-node1 nginx:1\n", map[string]string{"If-None-Match": "", "User-Agent": "noderun"}},
		{"304 changes nothing", body(manifest("web", "nginx:2"), "ETag", `"v1"`),
			"web-node1 nginx:1\n", map[string]string{"If-None-Match": `"v1"`}},
		{"500", func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "oops", 500) },
			"web-node1 nginx:1\nerror " + u + ": unexpected HTTP status: 500 Internal Server Error\n", nil},
		{"empty body", body("\n---\n# nothing\n"),
			"web-node1 nginx:1\nerror " + u + ": empty body (serve an empty PodList for no pods)\n", nil},
		{"oversized body", body(manifest("web", "nginx:3") + "#" + strings.Repeat("x", MaxFileSize)),
			"web-node1 nginx:1\nerror " + u + ": manifest file is larger than 10 MiB\n", nil},
		{"oversized body without length", func(w http.ResponseWriter, _ *http.Request) {
			for range MaxFileSize/4096 + 1 {
				w.Write([]byte(strings.Repeat("#", 4095) + "\n"))
				w.(http.Flusher).Flush()
			}
		}, "web-node1 nginx:1\nerror " + u + ": manifest file is larger than 10 MiB\n", nil},
		{"undecodable body keeps the last good spec", body("kind: [Pod\n"),
			"web-node1 nginx:1 (last good)\nerror " + u + ":1: invalid YAML: line 1: did not find expected ',' or ']'\n", nil},
		{"a new valid version replaces it", body(manifest("web", "nginx:4"), "Last-Modified", "Mon, 02 Jan 2026 15:04:05 GMT"),
			"web-node1 nginx:4\n", map[string]string{"If-None-Match": "", "If-Modified-Since": ""}},
		{"Last-Modified makes it conditional", func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("If-Modified-Since") != "" {
				w.WriteHeader(http.StatusNotModified)
				return
			}
			w.Write([]byte("kind: [broken"))
		}, "web-node1 nginx:4\n", map[string]string{"If-Modified-Since": "Mon, 02 Jan 2026 15:04:05 GMT"}},
		{"PodList", body(podList), "a-node1 nginx:a\n", nil},
		{"explicit empty PodList means no pods", body("apiVersion: v1\nkind: PodList\nitems: []\n"), "", nil},
	}
	for _, st := range steps {
		srv.set(st.respond)
		if got := pollSummary(r); got != st.want {
			t.Fatalf("%s:\n%s\nwant:\n%s", st.name, got, st.want)
		}
		for name, want := range st.wantHeaders {
			if got := srv.lastHeader().Get(name); got != want {
				t.Errorf("%s: request header %s = %q, want %q", st.name, name, got, want)
			}
		}
	}
}

func TestURLSourceTimeouts(t *testing.T) {
	tests := []struct {
		name    string
		respond http.HandlerFunc
	}{
		{"no answer", func(_ http.ResponseWriter, r *http.Request) { <-r.Context().Done() }},
		{"slow body", func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte(manifest("web", "nginx:2")[:20]))
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newServer(t)
			srv.set(body(manifest("web", "nginx:1")))
			// The first poll gets the default timeout: on a busy machine
			// (or under qemu) 100 ms may not cover even an answer.
			r := newTestURLRun(t, srv.URL)
			r.poll(context.Background())
			if r.fetchErr != nil {
				t.Fatalf("the first poll: %v", r.fetchErr)
			}
			r.timeout = 100 * time.Millisecond
			srv.set(tt.respond)
			r.poll(context.Background())
			if !errors.Is(r.fetchErr, context.DeadlineExceeded) {
				t.Fatalf("error %v, want a deadline exceeded", r.fetchErr)
			}
			snap, _ := r.snapshot()
			if len(snap.Pods) != 1 || snap.Pods[0].Spec.Containers[0].Image != "nginx:1" {
				t.Errorf("a timeout changed the pods: %s", summary(snap))
			}
		})
	}
}

func TestURLSourceSendsHeaders(t *testing.T) {
	srv := newServer(t)
	srv.set(body(manifest("web", "nginx")))
	name, value, err := ParseHeader("Authorization: Bearer s3cret")
	if err != nil {
		t.Fatal(err)
	}
	r := newTestURLRun(t, srv.URL, WithHeader(name, value), WithHeader("X-Node", "a"), WithHeader("X-Node", "b"),
		WithHeader("User-Agent", "fleet/1"))
	r.poll(context.Background())
	h := srv.lastHeader()
	if h.Get("Authorization") != "Bearer s3cret" || strings.Join(h.Values("X-Node"), ",") != "a,b" || h.Get("User-Agent") != "fleet/1" {
		t.Errorf("headers sent: %v", h)
	}
}

func TestParseHeader(t *testing.T) {
	tests := []struct {
		in, name, value string
		wantErr         bool
	}{
		{in: "Authorization: Bearer x y", name: "Authorization", value: "Bearer x y"},
		{in: "X-Empty:", name: "X-Empty"},
		{in: "X-Tight:v", name: "X-Tight", value: "v"},
		{in: "no colon", wantErr: true},
		{in: "Bad Name: v", wantErr: true},
		{in: ": v", wantErr: true},
	}
	for _, tt := range tests {
		name, value, err := ParseHeader(tt.in)
		if (err != nil) != tt.wantErr || name != tt.name || value != tt.value {
			t.Errorf("ParseHeader(%q) = %q, %q, %v", tt.in, name, value, err)
		}
	}
}

func TestNewURLSourceErrors(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		url  string
		opts []URLOption
	}{
		{"not http", "ftp://example.com/pods", nil},
		{"no host", "http:///pods", nil},
		{"missing CA file", "https://example.com", []URLOption{WithTLSFiles(filepath.Join(dir, "none.pem"), "", "")}},
		{"certificate without key", "https://example.com", []URLOption{WithTLSFiles("", filepath.Join(dir, "c.pem"), "")}},
	}
	for _, tt := range tests {
		if _, err := NewURLSource(tt.url, "node1", tt.opts...); err == nil {
			t.Errorf("%s: no error", tt.name)
		}
	}
}

func TestURLSourceIdentity(t *testing.T) {
	srv := newServer(t)
	srv.set(body(manifest("web", "nginx")))
	withUser := strings.Replace(srv.URL, "http://", "http://user:pass@", 1)
	var uids []string
	for _, u := range []string{srv.URL, withUser} {
		r := newTestURLRun(t, u)
		r.poll(context.Background())
		snap, _ := r.snapshot()
		p := snap.Pods[0]
		if p.Annotations[ConfigSourceAnnotation] != "http" || snap.Source != "http:"+srv.URL {
			t.Errorf("source %q, annotation %q", snap.Source, p.Annotations[ConfigSourceAnnotation])
		}
		uids = append(uids, string(p.UID))
	}
	if uids[0] != uids[1] {
		t.Error("credentials in the URL changed the UID")
	}
	file := filepath.Join(t.TempDir(), "web.yaml")
	writeFile(t, file, manifest("web", "nginx"))
	if snap := CheckPath(file, "node1"); string(snap.Pods[0].UID) == uids[0] {
		t.Error("the same manifest from a file and a URL has the same UID")
	}
}

// The server's certificate and the client's come from a fresh CA, and the
// server requires a client certificate.
func TestURLSourceTLS(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t)
	caFile := filepath.Join(dir, "ca.pem")
	writeFile(t, caFile, string(ca.certPEM))
	certFile, keyFile := filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	cert, key := ca.issue(t, "node1", x509.ExtKeyUsageClientAuth)
	writeFile(t, certFile, string(cert))
	writeFile(t, keyFile, string(key))

	srv := httptest.NewUnstartedServer(body(manifest("web", "nginx")))
	srvCert, srvKey := ca.issue(t, "127.0.0.1", x509.ExtKeyUsageServerAuth)
	pair, err := tls.X509KeyPair(srvCert, srvKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.certPEM)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // refused handshakes are the point
	srv.StartTLS()
	t.Cleanup(srv.Close)

	tests := []struct {
		name    string
		files   []string // CA, cert, key
		wantErr bool
	}{
		{"CA and client certificate", []string{caFile, certFile, keyFile}, false},
		{"no client certificate", []string{caFile, "", ""}, true},
		{"system roots do not know the CA", []string{"", certFile, keyFile}, true},
	}
	for _, tt := range tests {
		r := newTestURLRun(t, srv.URL, WithTLSFiles(tt.files[0], tt.files[1], tt.files[2]))
		r.poll(context.Background())
		if (r.fetchErr != nil) != tt.wantErr {
			t.Errorf("%s: error %v", tt.name, r.fetchErr)
		}
	}
}

type testCA struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	certPEM []byte
}

func newCA(t *testing.T) *testCA {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, IsCA: true, BasicConstraintsValid: true,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

func (ca *testCA) issue(t *testing.T, name string, usage x509.ExtKeyUsage) (certPEM, keyPEM []byte) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
	}
	if ip := net.ParseIP(name); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// runURLSource runs a URLSource until the test ends.
func runURLSource(t *testing.T, rawURL string, opts ...URLOption) <-chan Snapshot {
	t.Helper()
	s, err := NewURLSource(rawURL, "node1", opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan Snapshot)
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, out) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return out
}

func TestURLSourceRunSendsChanges(t *testing.T) {
	srv := newServer(t)
	srv.set(body(manifest("web", "nginx:1"), "ETag", `"1"`))
	ch := runURLSource(t, srv.URL, WithCheckInterval(10*time.Millisecond))
	expect(t, next(t, ch), "web-node1 nginx:1\n")
	srv.set(body(manifest("web", "nginx:2"), "ETag", `"2"`))
	expect(t, next(t, ch), "web-node1 nginx:2\n")
	srv.set(func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "down", http.StatusBadGateway) })
	expect(t, next(t, ch), "web-node1 nginx:2\nerror "+srv.URL+": unexpected HTTP status: 502 Bad Gateway\n")
	srv.set(body(manifest("web", "nginx:2"), "ETag", `"2"`))
	expect(t, next(t, ch), "web-node1 nginx:2\n")
}

// After a reboot without network, the kept response runs at once, with the
// same UIDs, while the first fetch still hangs.
func TestURLSourceRebootRunsPersistedLastGood(t *testing.T) {
	stateDir := filepath.Join(t.TempDir(), "sources")
	srv := newServer(t)
	srv.set(body(manifest("web", "nginx:1")+"---\n"+manifest("db", "pg"), "ETag", `"v1"`))
	before := next(t, runURLSource(t, srv.URL, WithStateDir(stateDir)))
	expect(t, before, "web-node1 nginx:1\ndb-node1 pg\n")

	files, _ := filepath.Glob(filepath.Join(stateDir, "*.json"))
	if len(files) != 1 {
		t.Fatalf("state files %v, want one", files)
	}
	if fi, err := os.Stat(files[0]); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("state file: %v %v", fi.Mode(), err)
	}
	var kept persisted
	data, _ := os.ReadFile(files[0])
	if err := json.Unmarshal(data, &kept); err != nil || kept.ETag != `"v1"` || kept.URL != srv.URL {
		t.Fatalf("state file %s: %v", data, err)
	}

	srv.set(func(_ http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	after := next(t, runURLSource(t, srv.URL, WithStateDir(stateDir), WithTimeout(time.Hour)))
	expect(t, after, "web-node1 nginx:1\ndb-node1 pg\n")
	for i := range before.Pods {
		if before.Pods[i].UID != after.Pods[i].UID {
			t.Errorf("pod %s changed UID across the reboot", before.Pods[i].Name)
		}
	}
	if after.Info.ETag != `"v1"` || after.Info.Kind != KindURL {
		t.Errorf("info %+v", after.Info)
	}
}

func TestURLSourceKeepsOnlyGoodResponses(t *testing.T) {
	stateDir := t.TempDir()
	srv := newServer(t)
	srv.set(body(manifest("web", "nginx:1")))
	r := newTestURLRun(t, srv.URL, WithStateDir(stateDir))
	r.poll(context.Background())
	srv.set(body(strings.Replace(manifest("web", "nginx:2"), "image", "imag", 1)))
	r.poll(context.Background())

	reboot := newTestURLRun(t, srv.URL, WithStateDir(stateDir))
	if !reboot.restore() {
		t.Fatal("nothing kept")
	}
	snap, _ := reboot.snapshot()
	expect(t, snap, "web-node1 nginx:1\n")
}

func TestBackoff(t *testing.T) {
	tests := []struct {
		interval time.Duration
		failures int
		jitter   float64
		want     time.Duration
	}{
		{20 * time.Second, 0, 0.5, 20 * time.Second},
		{20 * time.Second, 1, 0.5, 20 * time.Second},
		{20 * time.Second, 2, 0.5, 40 * time.Second},
		{20 * time.Second, 4, 0.5, 160 * time.Second},
		{20 * time.Second, 5, 0.5, 5 * time.Minute},
		{20 * time.Second, 50, 0.5, 5 * time.Minute},
		{20 * time.Second, 0, 0, 18 * time.Second},
		{20 * time.Second, 0, 0.999999, 22 * time.Second},
		{time.Hour, 3, 0.5, time.Hour},
	}
	for _, tt := range tests {
		got := backoff(tt.interval, tt.failures, tt.jitter)
		if d := got - tt.want; d < -time.Millisecond || d > time.Millisecond {
			t.Errorf("backoff(%v, %d, %v) = %v, want %v", tt.interval, tt.failures, tt.jitter, got, tt.want)
		}
	}
}

func TestRedactURL(t *testing.T) {
	tests := []struct{ in, want string }{
		{"https://h/p", "https://h/p"},
		{"https://user:pass@h/p?token=s3cret&node=a#frag", "https://h/p?token=xxxxx&node=xxxxx"},
		{"https://h/p?s3cret", "https://h/p?xxxxx"},
		{"https://h/p?a=&b=1;c", "https://h/p?a=xxxxx&b=xxxxx"},
		{"http://h:8080/a%20b?X-Amz-Signature=abc", "http://h:8080/a%20b?X-Amz-Signature=xxxxx"},
		{"http://h/%zz?token=s3cret", "(invalid URL)"},
	}
	for _, tt := range tests {
		if got := RedactURL(tt.in); got != tt.want {
			t.Errorf("RedactURL(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// No secret of the URL (password, query value) shows in the snapshot, its
// errors, the logs or the kept state; the pods' UIDs and the state file
// still depend on the query, as before query values were hidden.
func TestURLSourceHidesQueryAndCredentials(t *testing.T) {
	stateDir := t.TempDir()
	srv := newServer(t)
	var logs strings.Builder
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	secretURL := strings.Replace(srv.URL, "http://", "http://user:pa55@", 1) + "/pods?token=s3cret"
	shown := srv.URL + "/pods?token=xxxxx"

	srv.set(body(manifest("web", "nginx:1")))
	r := newTestURLRun(t, secretURL, WithStateDir(stateDir), WithURLLogger(logger))
	r.poll(context.Background())
	good, _ := r.snapshot()
	srv.set(body(strings.Replace(manifest("web", "nginx:2"), "image", "imag", 1)))
	r.poll(context.Background())
	srv.set(func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "down", http.StatusBadGateway) })
	r.poll(context.Background())
	bad, _ := r.snapshot()
	reboot := newTestURLRun(t, secretURL, WithStateDir(stateDir), WithURLLogger(logger))
	if !reboot.restore() {
		t.Fatal("nothing kept")
	}

	if bad.Source != "http:"+shown || bad.Info.URL != shown || len(bad.Errors) != 2 {
		t.Errorf("source %q, URL %q, errors %v", bad.Source, bad.Info.URL, bad.Errors)
	}
	info, _ := json.Marshal(bad.Info)
	files, _ := filepath.Glob(filepath.Join(stateDir, "*"))
	var state []byte
	if len(files) == 1 {
		state, _ = os.ReadFile(files[0])
	}
	for what, text := range map[string]string{"info": string(info), "errors": fmt.Sprint(bad.Errors), "logs": logs.String(), "state": string(state)} {
		if strings.Contains(text, "s3cret") || strings.Contains(text, "pa55") {
			t.Errorf("%s shows a secret: %s", what, text)
		}
	}
	sum := sha256.Sum256([]byte(srv.URL + "/pods?token=s3cret"))
	if want := filepath.Join(stateDir, hex.EncodeToString(sum[:])+".json"); len(files) != 1 || files[0] != want {
		t.Errorf("state files %v, want %s (the name of earlier releases)", files, want)
	}
	other := newTestURLRun(t, srv.URL+"/pods?token=other")
	srv.set(body(manifest("web", "nginx:1")))
	other.poll(context.Background())
	otherSnap, _ := other.snapshot()
	if good.Pods[0].UID == otherSnap.Pods[0].UID {
		t.Error("URLs with different query values gave the same UID")
	}
	// Earlier releases named the source by the URL without credentials.
	old := parseManifest([]byte(manifest("web", "nginx:1")), "x", "node1", "http:"+srv.URL+"/pods?token=s3cret", time.Now(), parseOptions{})
	if want := old.pods[0].pod.UID; good.Pods[0].UID != want {
		t.Errorf("UID %s, want %s as earlier releases made it", good.Pods[0].UID, want)
	}
}

func TestNewURLSourceErrorHidesURL(t *testing.T) {
	for _, u := range []string{"http://user:pa55@h/%zz?token=s3cret", "ftp://user:pa55@h/p?token=s3cret"} {
		_, err := NewURLSource(u, "node1")
		if err == nil || strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), "pa55") {
			t.Errorf("NewURLSource(%q): %v", u, err)
		}
	}
}

func TestSameURL(t *testing.T) {
	tests := []struct {
		a, b string
		want bool
	}{
		{"https://a:1@h/p?q=1", "https://b:2@h/p?q=1", true},
		{"https://h/p?q=1", "https://h/p?q=1#x", true},
		{"https://h/p?q=1", "https://h/p?q=2", false},
		{"https://h/p", "https://h/q", false},
	}
	for _, tt := range tests {
		if got := SameURL(tt.a, tt.b); got != tt.want {
			t.Errorf("SameURL(%q, %q) = %v", tt.a, tt.b, got)
		}
	}
}

func TestReadHeaderFile(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := file("good", "# fleet token\nAuthorization: Bearer s3cret\n\n  X-Node: a\r\nX-Node:b\n", 0o600)
	h, err := ReadHeaderFile(good)
	if err != nil || h.Get("Authorization") != "Bearer s3cret" || strings.Join(h.Values("X-Node"), ",") != "a,b" || len(h) != 2 {
		t.Errorf("ReadHeaderFile: %v, %v", h, err)
	}
	if _, err := ReadHeaderFile(file("open", "Authorization: Bearer s3cret\n", 0o644)); !errors.Is(err, ErrHeaderFileMode) {
		t.Errorf("a mode 644 file: %v, want ErrHeaderFileMode", err)
	}
	bad := file("bad", "X-Ok: 1\nBearer s3cret\n", 0o400)
	if _, err := ReadHeaderFile(bad); err == nil || !strings.Contains(err.Error(), bad+":2:") || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("a bad line: %v, want its line and not its text", err)
	}
	if _, err := ReadHeaderFile(filepath.Join(dir, "none")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing file: %v", err)
	}
}

// A redirect to another host (or port) gets none of the configured headers
// (tokens often travel in headers other than Authorization); one to the
// same host gets them all; one from https to http is refused.
func TestURLSourceRedirects(t *testing.T) {
	got := make(chan http.Header, 1)
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Clone()
		io.WriteString(w, manifest("web", "nginx"))
	}))
	t.Cleanup(target.Close)
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/other-host": // another name of the target
			http.Redirect(w, r, strings.Replace(target.URL, "127.0.0.1", "localhost", 1)+"/pods.yaml", http.StatusFound)
		case "/other-port":
			http.Redirect(w, r, target.URL+"/pods.yaml", http.StatusFound)
		case "/same-host":
			http.Redirect(w, r, "/pods.yaml", http.StatusMovedPermanently)
		default:
			got <- r.Header.Clone()
			io.WriteString(w, manifest("web", "nginx"))
		}
	}))
	t.Cleanup(origin.Close)
	opts := []URLOption{WithHeader("PRIVATE-TOKEN", "s3cret-token"), WithHeader("Authorization", "Bearer s3cret"), WithHeader("X-Node", "a")}
	for _, tt := range []struct {
		url         string
		wantHeaders bool
	}{
		{origin.URL + "/other-host", false},
		{origin.URL + "/other-port", false},
		{origin.URL + "/same-host", true},
	} {
		r := newTestURLRun(t, tt.url, opts...)
		if _, err := r.fetch(context.Background()); err != nil {
			t.Fatalf("%s: %v", tt.url, err)
		}
		h := <-got
		for _, name := range []string{"PRIVATE-TOKEN", "Authorization", "X-Node"} {
			if sent := h.Get(name) != ""; sent != tt.wantHeaders {
				t.Errorf("%s: header %s sent %t, want %t", tt.url, name, sent, tt.wantHeaders)
			}
		}
	}

	secure := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL+"/pods.yaml", http.StatusFound)
	}))
	t.Cleanup(secure.Close)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	writeFile(t, caFile, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: secure.Certificate().Raw})))
	r := newTestURLRun(t, secure.URL+"/pods.yaml", append(opts, WithTLSFiles(caFile, "", ""))...)
	if _, err := r.fetch(context.Background()); !errors.Is(err, ErrInsecureRedirect) {
		t.Errorf("https redirected to http: %v, want %v", err, ErrInsecureRedirect)
	}
	select {
	case h := <-got:
		t.Errorf("the http target was asked, with %v", h)
	default:
	}
}

// A URL's Secret documents are used, but the kept copy leaves them out (and
// the validators, which name the whole body): no secret is on disk, and an
// offline start runs the rest.
func TestURLSourceKeepsNoSecrets(t *testing.T) {
	stateDir := filepath.Join(t.TempDir(), "sources")
	srv := newServer(t)
	secret := "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\nstringData: {k: hunter2}\n"
	cm := "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {k: v}\n"
	srv.set(body(manifest("web", "nginx:1")+"---\n"+secret+"---\n"+cm, "ETag", `"v1"`))
	before := next(t, runURLSource(t, srv.URL, WithStateDir(stateDir), WithURLLocalConfigObjects()))
	if len(before.Secrets) != 1 || len(before.ConfigMaps) != 1 || len(before.Pods) != 1 {
		t.Fatalf("snapshot: %d secrets, %d configMaps, %d pods; errors %v", len(before.Secrets), len(before.ConfigMaps), len(before.Pods), before.Errors)
	}
	files, _ := filepath.Glob(filepath.Join(stateDir, "*.json"))
	if len(files) != 1 {
		t.Fatalf("state files %v, want one", files)
	}
	data, _ := os.ReadFile(files[0])
	var kept persisted
	if err := json.Unmarshal(data, &kept); err != nil || strings.Contains(string(data), "hunter2") || kept.ETag != "" || !strings.Contains(kept.Body, "kind: ConfigMap") {
		t.Fatalf("state file %s: %v", data, err)
	}
	srv.set(func(_ http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	after := next(t, runURLSource(t, srv.URL, WithStateDir(stateDir), WithTimeout(time.Hour), WithURLLocalConfigObjects()))
	if len(after.Secrets) != 0 || len(after.ConfigMaps) != 1 || len(after.Pods) != 1 || before.Pods[0].UID != after.Pods[0].UID {
		t.Errorf("offline start: %d secrets, %d configMaps, %d pods, errors %v", len(after.Secrets), len(after.ConfigMaps), len(after.Pods), after.Errors)
	}
}
