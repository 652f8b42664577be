package manifests

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/noderun/noderun/internal/atomicfile"
	"github.com/noderun/noderun/internal/secretfile"
)

// Why a fetch changed nothing; the last good set keeps running.
var (
	ErrHTTPStatus = errors.New("unexpected HTTP status")
	ErrEmptyBody  = errors.New("empty body (serve an empty PodList for no pods)")
	// ErrInsecureRedirect: an https URL redirected to plain http, where
	// the headers and the manifests could be read and changed on the way.
	ErrInsecureRedirect = errors.New("redirect from https to http refused")
)

// maxRedirects is how many redirects a fetch follows, as Go's default.
const maxRedirects = 10

// maxURLBackoff caps the wait between failed polls, unless the check
// interval is longer.
const maxURLBackoff = 5 * time.Minute

// URLSource polls a URL for Pod manifests (a Pod, a PodList or several YAML
// documents) and emits a Snapshot whenever what it serves changes.
type URLSource struct {
	url      string // as given, for requests
	display  string // without credentials or query values: logs, errors, /manifests
	identity string // without credentials: the pods' UIDs and the state file
	nodeName string
	source   string
	headers  http.Header
	interval time.Duration
	timeout  time.Duration
	stateDir string // where the last good response is kept; "" keeps none
	opts     parseOptions
	tls      tlsFiles
	client   *http.Client
	log      *slog.Logger
	jitter   func() float64 // in [0, 1)
}

// URLOption configures a URLSource.
type URLOption func(*URLSource)

// WithCheckInterval sets how often the URL is polled; the default is 20s.
func WithCheckInterval(d time.Duration) URLOption {
	return func(s *URLSource) { s.interval = d }
}

// WithTimeout bounds each request, body included; the default is 10s.
func WithTimeout(d time.Duration) URLOption {
	return func(s *URLSource) { s.timeout = d }
}

// WithHeader adds a request header, e.g. an Authorization token.
func WithHeader(name, value string) URLOption {
	return func(s *URLSource) { s.headers.Add(name, value) }
}

// WithTLSFiles makes the source trust only the CAs in caFile (when set) and
// present the client certificate in certFile and keyFile (when set).
func WithTLSFiles(caFile, certFile, keyFile string) URLOption {
	return func(s *URLSource) { s.tls = tlsFiles{ca: caFile, cert: certFile, key: keyFile} }
}

// WithStateDir keeps the last good response in dir, so that pods from the
// URL run after a reboot without network.
func WithStateDir(dir string) URLOption {
	return func(s *URLSource) { s.stateDir = dir }
}

// WithURLLocalConfigObjects is WithLocalConfigObjects for a URL: its
// ConfigMap and Secret documents are read. Secret documents are left out
// of the response kept in the state directory, so that no secret is
// written to disk; an offline start runs without them.
func WithURLLocalConfigObjects() URLOption {
	return func(s *URLSource) { s.opts.localConfig = true }
}

// WithURLLogger sets the logger; the default discards.
func WithURLLogger(l *slog.Logger) URLOption {
	return func(s *URLSource) { s.log = l }
}

// WithDisplayTag tells apart, in what is shown, URLs that differ only in
// query values: tag is appended to the shown URL as "#tag".
func WithDisplayTag(tag string) URLOption {
	return func(s *URLSource) { s.display += "#" + tag }
}

// NewURLSource returns a source for an http or https URL whose pods are to
// run on nodeName. Credentials in the URL are left out of the pods' identity,
// so rotating them does not restart the pods.
func NewURLSource(rawURL, nodeName string, opts ...URLOption) (*URLSource, error) {
	u, err := parseURL(rawURL)
	if err != nil {
		return nil, err
	}
	u.User = nil
	s := &URLSource{url: rawURL, display: redact(u), identity: u.String(), nodeName: nodeName, headers: http.Header{}}
	for _, o := range opts {
		o(s)
	}
	if s.interval <= 0 {
		s.interval = 20 * time.Second
	}
	if s.timeout <= 0 {
		s.timeout = 10 * time.Second
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.jitter = rand.Float64
	s.source = "http:" + s.display
	if s.client, err = s.tls.client(); err != nil {
		return nil, fmt.Errorf("manifest URL %s: %w", s.display, err)
	}
	s.client.CheckRedirect = s.checkRedirect
	return s, nil
}

// checkRedirect refuses a redirect from https to http, and sends the
// configured headers only to the URL's own host (and port): they usually
// carry a token, and Go itself drops only Authorization and Cookie on the
// way to another host.
func (s *URLSource) checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) >= maxRedirects {
		return fmt.Errorf("stopped after %d redirects", maxRedirects)
	}
	for _, prev := range via {
		if prev.URL.Scheme == "https" && req.URL.Scheme != "https" {
			return fmt.Errorf("%w: to %s", ErrInsecureRedirect, redact(req.URL))
		}
	}
	if !strings.EqualFold(req.URL.Host, via[0].URL.Host) {
		for name := range s.headers {
			req.Header.Del(name)
		}
	}
	return nil
}

// parseURL parses a manifest URL; its errors do not quote it, since it may
// hold a password or a token.
func parseURL(rawURL string) (*url.URL, error) {
	u, err := url.Parse(rawURL)
	var ue *url.Error
	if errors.As(err, &ue) {
		return nil, fmt.Errorf("manifest URL: %w", ue.Err)
	}
	if err != nil {
		return nil, fmt.Errorf("manifest URL: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("manifest URL %s: want http:// or https://", redact(u))
	}
	return u, nil
}

// RedactURL is rawURL as it may be shown: without userinfo or fragment, and
// with each query value replaced by "xxxxx" (a whole parameter when it has no
// "="), since presigned and private-token URLs carry their secret there.
func RedactURL(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "(invalid URL)"
	}
	return redact(u)
}

func redact(u *url.URL) string {
	r := *u
	r.User, r.Fragment, r.RawFragment = nil, "", ""
	if r.RawQuery != "" {
		params := strings.Split(r.RawQuery, "&")
		for i, p := range params {
			if key, _, ok := strings.Cut(p, "="); ok {
				params[i] = key + "=xxxxx"
			} else {
				params[i] = "xxxxx"
			}
		}
		r.RawQuery = strings.Join(params, "&")
	}
	return r.String()
}

// SameURL reports whether a and b differ at most in credentials, so that
// polling both would fetch the same manifests into one state file.
func SameURL(a, b string) bool {
	ua, erra := url.Parse(a)
	ub, errb := url.Parse(b)
	if erra != nil || errb != nil {
		return a == b
	}
	ua.User, ub.User = nil, nil
	ua.Fragment, ub.Fragment = "", "" // never sent
	return ua.String() == ub.String()
}

// tlsFiles names the PEM files of a URL source's TLS settings; "" for none.
type tlsFiles struct{ ca, cert, key string }

func (f tlsFiles) client() (*http.Client, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.ca != "" {
		pem, err := os.ReadFile(f.ca)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s: no PEM certificate", f.ca)
		}
	}
	if (f.cert == "") != (f.key == "") {
		return nil, errors.New("a client certificate needs both a certificate and a key file")
	}
	if f.cert != "" {
		cert, err := tls.LoadX509KeyPair(f.cert, f.key)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = cfg
	return &http.Client{Transport: tr}, nil
}

// headerRE is an HTTP header line: a token, a colon, a value.
var headerRE = regexp.MustCompile("^([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*(.*)$")

// ParseHeader splits "Name: value" as given to --manifest-url-header.
func ParseHeader(line string) (name, value string, err error) {
	m := headerRE.FindStringSubmatch(line)
	if m == nil {
		return "", "", fmt.Errorf("header %q: want \"Name: value\"", line)
	}
	return m[1], strings.TrimSpace(m[2]), nil
}

// ErrHeaderFileMode is why a header file that group or others may access is
// refused: it holds tokens, which is why they are not on the command line.
var ErrHeaderFileMode = secretfile.ErrMode

// ReadHeaderFile reads "Name: value" lines, as given to
// --manifest-url-header-file; blank lines and lines starting with "#" are
// skipped. Errors name the line but never quote it: it may hold a secret.
func ReadHeaderFile(path string) (http.Header, error) {
	f, err := secretfile.Open(path)
	if errors.Is(err, secretfile.ErrMode) {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize))
	if err != nil {
		return nil, err
	}
	h := http.Header{}
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, value, err := ParseHeader(line)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: want \"Name: value\"", path, i+1)
		}
		h.Add(name, value)
	}
	return h, nil
}

// Run sends a Snapshot promptly (the persisted last good set at once, if
// there is one, else the first fetch's outcome), then one each time what the
// URL serves changes, until ctx ends. It always returns nil.
func (s *URLSource) Run(ctx context.Context, out chan<- Snapshot) error {
	r := &urlRun{URLSource: s}
	sent := false
	if r.restore() {
		if !r.send(ctx, out, true) {
			return nil
		}
		sent = true
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		}
		r.poll(ctx)
		if !r.send(ctx, out, !sent) {
			return nil
		}
		sent = true
		timer.Reset(backoff(r.interval, r.failures, r.jitter()))
	}
}

// backoff is the wait before the next poll: the interval, doubled for each
// consecutive failure after the first up to maxURLBackoff (or the interval if
// longer), then within ±10% so that a fleet does not poll in step.
func backoff(interval time.Duration, failures int, jitter float64) time.Duration {
	d := interval
	for i := 1; i < failures && d < maxURLBackoff; i++ {
		d *= 2
	}
	d = min(d, max(interval, maxURLBackoff))
	return time.Duration(float64(d) * (0.9 + 0.2*jitter))
}

// urlRun is the state of one Run.
type urlRun struct {
	*URLSource
	content      *fileResult // from the last body accepted; nil before any
	etag         string
	lastModified string
	fetchErr     error // the last poll's failure, if it failed
	failures     int   // consecutive failed polls
	emitter
}

// response is a successful fetch: a new body, or notModified.
type response struct {
	notModified  bool
	body         []byte
	etag         string
	lastModified string
}

// poll fetches the URL once; a failure changes nothing but the error shown.
func (r *urlRun) poll(ctx context.Context) {
	resp, err := r.fetch(ctx)
	if err == nil && !resp.notModified && emptyManifest(resp.body) {
		err = ErrEmptyBody
	}
	if err != nil {
		r.failures++
		r.fetchErr = &ManifestError{File: r.display, Err: err}
		return
	}
	r.failures, r.fetchErr = 0, nil
	if resp.notModified {
		return
	}
	r.etag, r.lastModified = resp.etag, resp.lastModified
	if r.content != nil && r.content.readOK && bytes.Equal(r.content.data, resp.body) {
		return
	}
	r.content = keepLastGood(r.content, parseManifest(resp.body, r.display, r.nodeName, "http:"+r.identity, time.Now(), r.opts))
	if len(r.content.errs) == 0 {
		r.persist()
	}
}

func (r *urlRun) fetch(ctx context.Context) (response, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.url, nil)
	if err != nil {
		return response{}, err
	}
	req.Header = r.headers.Clone()
	if req.Header.Get("User-Agent") == "" {
		req.Header.Set("User-Agent", "noderun")
	}
	// Conditional only with a body to fall back on.
	if r.content != nil && r.etag != "" {
		req.Header.Set("If-None-Match", r.etag)
	}
	if r.content != nil && r.lastModified != "" {
		req.Header.Set("If-Modified-Since", r.lastModified)
	}
	resp, err := r.client.Do(req)
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err // the error names the URL already
	}
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotModified && r.content != nil:
		return response{notModified: true}, nil
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		return response{}, fmt.Errorf("%w: %s", ErrHTTPStatus, resp.Status)
	case resp.ContentLength > MaxFileSize:
		return response{}, ErrTooLarge
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxFileSize+1))
	if err != nil {
		return response{}, fmt.Errorf("reading body: %w", err)
	}
	if len(body) > MaxFileSize {
		return response{}, ErrTooLarge
	}
	return response{body: body, etag: resp.Header.Get("ETag"), lastModified: resp.Header.Get("Last-Modified")}, nil
}

// emptyManifest reports whether data holds no document at all, as opposed
// to an explicit empty PodList: a truncated or blank answer must not stop
// every pod.
func emptyManifest(data []byte) bool {
	for _, c := range splitDocuments(data) {
		if js, err := yaml.YAMLToJSON(c.text); err != nil || !bytes.Equal(js, []byte("null")) {
			return false
		}
	}
	return true
}

func (r *urlRun) send(ctx context.Context, out chan<- Snapshot, force bool) bool {
	snap, fingerprint := r.snapshot()
	return r.emit(ctx, out, snap, fingerprint, force, r.log)
}

func (r *urlRun) snapshot() (Snapshot, string) {
	results := map[string]*fileResult{}
	var order []string
	if r.content != nil {
		results[r.display], order = r.content, []string{r.display}
	}
	var extra []error
	if r.fetchErr != nil {
		extra = append(extra, r.fetchErr)
	}
	snap, fp := assemble(r.source, order, results, extra...)
	snap.Info.Kind, snap.Info.URL = KindURL, r.display
	snap.Info.ETag, snap.Info.LastModified = r.etag, r.lastModified
	if r.content != nil {
		snap.Info.ReadAt = r.content.readAt
	}
	snap.Unavailable = r.content == nil
	return snap, fp
}

// persisted is the last good response as kept in the state directory.
type persisted struct {
	URL          string    `json:"url"`
	Body         string    `json:"body"`
	ETag         string    `json:"etag,omitempty"`
	LastModified string    `json:"lastModified,omitempty"`
	FetchedAt    time.Time `json:"fetchedAt"`
}

// statePath is <state dir>/<sha256 of the URL without credentials>.json.
func (r *urlRun) statePath() string {
	sum := sha256.Sum256([]byte(r.identity))
	return filepath.Join(r.stateDir, hex.EncodeToString(sum[:])+".json")
}

// persist writes the current body atomically; the body may hold secrets, so
// only root reads it. A failure is logged: the pods run all the same.
func (r *urlRun) persist() {
	if r.stateDir == "" {
		return
	}
	keep := persisted{URL: r.display, Body: string(r.content.data), ETag: r.etag,
		LastModified: r.lastModified, FetchedAt: r.content.readAt}
	if body, cut := withoutSecrets(r.content.data); cut {
		// Not the body the validators name: the next fetch must be whole.
		keep.Body, keep.ETag, keep.LastModified = string(body), "", ""
		r.log.Info("the kept manifests leave out Secret documents; an offline start runs without them", "url", r.display)
	}
	data, err := json.Marshal(keep)
	if err == nil {
		err = os.MkdirAll(filepath.Dir(r.statePath()), 0o700)
	}
	if err == nil {
		err = atomicfile.WriteFile(r.statePath(), data, 0o600)
	}
	if err != nil {
		r.log.Warn("cannot keep the last good manifests", "url", r.display, "err", err)
	}
}

// restore loads the persisted last good response, if any, and reports
// whether it did.
func (r *urlRun) restore() bool {
	if r.stateDir == "" {
		return false
	}
	data, err := os.ReadFile(r.statePath())
	if errors.Is(err, os.ErrNotExist) {
		return false
	}
	var p persisted
	if err == nil {
		err = json.Unmarshal(data, &p)
	}
	if err != nil {
		r.log.Warn("ignoring the kept manifests", "url", r.display, "err", err)
		return false
	}
	r.content = parseManifest([]byte(p.Body), r.display, r.nodeName, "http:"+r.identity, p.FetchedAt, r.opts)
	r.etag, r.lastModified = p.ETag, p.LastModified
	r.log.Info("running the kept manifests until the URL answers", "url", r.display, "fetched", p.FetchedAt)
	return true
}
