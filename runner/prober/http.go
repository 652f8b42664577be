package prober

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
)

// probeClient makes httpGet probes as the kubelet's prober does: redirects
// to the same host are followed (at most 10), one to another host is
// returned as it is. It has no Timeout: the request's context carries the
// probe's, and clientError words a timeout as the kubelet's client would.
var probeClient = &http.Client{Transport: oneShot{}, CheckRedirect: redirectChecker}

// probeTransport is the kubelet prober's transport: a fresh connection per
// probe, no certificate checks, no proxy, no compression. oneShot hands it
// what it does not make itself (HTTPS).
var probeTransport = &http.Transport{
	TLSClientConfig:    &tls.Config{InsecureSkipVerify: true}, // the kubelet does not verify probes either
	DisableKeepAlives:  true,
	DisableCompression: true,
	Proxy:              nil,
	DialContext:        probeDialer.DialContext,
}

// hookClient is the kubelet's client for httpGet hooks: no certificate
// checks, same-host redirects. Each hook is one request, so it keeps no
// idle connections to pods.
var hookClient = &http.Client{
	Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, // as the kubelet's
		DisableKeepAlives: true,
		Proxy:             nil,
	},
	CheckRedirect: redirectChecker,
}

// redirectChecker is the kubelet's: follow redirects to the same host, at
// most 10; stop at one to another host, whose 3xx then answers the request.
func redirectChecker(req *http.Request, via []*http.Request) error {
	if req.URL.Hostname() != via[0].URL.Hostname() {
		return http.ErrUseLastResponse
	}
	if len(via) >= 10 {
		return errors.New("stopped after 10 redirects")
	}
	return nil
}

// doHTTP is the kubelet's http prober: 200-399 succeeds (a redirect that
// was not followed with the kubelet's warning), anything else fails with
// the status code; a request that fails says why; a body that cannot be
// read is an error.
func doHTTP(ctx context.Context, h *v1.HTTPGetAction, t Target) (Result, string, error) {
	req, err := newRequest(ctx, h, t, "probe")
	if err != nil {
		return Unknown, "", err
	}
	resp, err := probeClient.Do(req)
	if err != nil {
		return Failure, clientError(ctx, err), nil
	}
	defer resp.Body.Close()
	code := resp.StatusCode
	if code >= http.StatusMultipleChoices && code < http.StatusBadRequest {
		body, err := io.ReadAll(io.LimitReader(resp.Body, maxOutput))
		if err != nil {
			return Unknown, "", err
		}
		return Success, "Probe terminated redirects, Response body: " + string(body), nil
	}
	// The kubelet reads up to 10 KiB of any body before closing; only a
	// redirect's ends up in a message.
	if _, err := io.CopyN(io.Discard, resp.Body, maxOutput); err != nil && err != io.EOF {
		return Unknown, "", err
	}
	if code >= http.StatusOK && code < http.StatusMultipleChoices {
		return Success, "", nil
	}
	return Failure, fmt.Sprintf("HTTP probe failed with statuscode: %d", code), nil
}

// clientError words a failed request as the kubelet's client does: that
// one has a Timeout, so net/http says when it was exceeded.
func clientError(ctx context.Context, err error) string {
	var ue *url.Error
	if expired(ctx) && errors.As(err, &ue) {
		return fmt.Sprintf("%s %q: %v (Client.Timeout exceeded while awaiting headers)", ue.Op, ue.URL, ue.Err)
	}
	return err.Error()
}

// newRequest is the kubelet's NewRequestForHTTPGetAction: the handler's
// scheme, host (else the pod's IP), port and path; its headers, with a
// Host header becoming the request's host; User-Agent kube-<purpose>/1.37
// and Accept */* unless given (an empty Accept sends none).
func newRequest(ctx context.Context, h *v1.HTTPGetAction, t Target, purpose string) (*http.Request, error) {
	scheme := strings.ToLower(string(h.Scheme))
	if scheme == "" {
		scheme = "http"
	}
	host := h.Host
	if host == "" {
		host = t.PodIP
	}
	port, err := resolvePort(h.Port, t.Container)
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(h.Path)
	if err != nil {
		// Too late to refuse the path; the kubelet passes it as it is.
		u = &url.URL{Path: h.Path}
	}
	u.Scheme, u.Host = scheme, net.JoinHostPort(host, strconv.Itoa(port))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	headers := make(http.Header, len(h.HTTPHeaders)+2)
	for _, hd := range h.HTTPHeaders {
		headers.Add(hd.Name, hd.Value)
	}
	if _, ok := headers["User-Agent"]; !ok {
		headers.Set("User-Agent", "kube-"+purpose+"/"+version)
	}
	if _, ok := headers["Accept"]; !ok {
		headers.Set("Accept", "*/*")
	} else if headers.Get("Accept") == "" {
		headers.Del("Accept")
	}
	req.Header = headers
	req.Host = headers.Get("Host")
	return req, nil
}

// oneShot makes a plain-HTTP request on a fresh connection: written as
// http.Transport writes it with keep-alives off (Connection: close), read
// with http.ReadResponse. That skips the Transport's dial queue and its
// two goroutines per connection, which cost more CPU than the exchange
// itself. HTTPS, a request without a deadline and one whose headers the
// Transport would refuse go to probeTransport.
type oneShot struct{}

func (oneShot) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	deadline, ok := ctx.Deadline()
	if !ok || req.URL.Scheme != "http" || !plainRequest(req) {
		return probeTransport.RoundTrip(req)
	}
	conn, err := dial(ctx, req.URL, deadline)
	if err != nil {
		return nil, ctxErr(ctx, err)
	}
	resp, br, err := exchange(conn, req)
	if err != nil {
		conn.Close()
		return nil, ctxErr(ctx, err)
	}
	resp.Body = &oneShotBody{ReadCloser: resp.Body, conn: conn, br: br}
	return resp, nil
}

// dial connects to the URL's host by the deadline: with blocking calls
// when the host is an IP address (a pod's always is), else through the
// netpoller. A context cancelled before its deadline (the worker stopped)
// ends the exchange either way.
func dial(ctx context.Context, u *url.URL, deadline time.Time) (io.ReadWriteCloser, error) {
	addr := dialAddr(u)
	if ap, err := netip.ParseAddrPort(addr); err == nil && ap.Addr().Zone() == "" {
		ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
		if c, ok, err := dialBlocking(ctx, ap, deadline); ok {
			if err != nil {
				return nil, err
			}
			return c, nil
		}
	}
	conn, err := probeDialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	_ = conn.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	return &polledConn{Conn: conn, stop: stop}, nil
}

// polledConn is a connection through the netpoller whose Close also
// drops its cancellation.
type polledConn struct {
	net.Conn
	stop func() bool
}

func (c *polledConn) Close() error {
	c.stop()
	return c.Conn.Close()
}

// exchange writes req on conn and reads the final response's header.
func exchange(conn io.ReadWriter, req *http.Request) (*http.Response, *bufio.Reader, error) {
	buf := writeBufs.Get().(*bytes.Buffer)
	defer writeBufs.Put(buf)
	buf.Reset()
	w := *req
	w.Close = true
	if err := w.Write(buf); err != nil {
		return nil, nil, err
	}
	if _, err := conn.Write(buf.Bytes()); err != nil {
		return nil, nil, err
	}
	br := readers.Get().(*bufio.Reader)
	br.Reset(conn)
	for {
		resp, err := http.ReadResponse(br, req)
		if err != nil {
			br.Reset(nil)
			readers.Put(br)
			return nil, nil, err
		}
		// Informational answers precede the real one; the Transport skips
		// them too.
		if resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
			continue
		}
		return resp, br, nil
	}
}

var (
	writeBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}
	readers   = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 4096) }}
)

// oneShotBody closes its connection with the body, without first reading
// to the end as a response body's Close would.
type oneShotBody struct {
	io.ReadCloser
	conn io.Closer
	br   *bufio.Reader
}

func (b *oneShotBody) Read(p []byte) (int, error) {
	if b.conn == nil {
		return 0, http.ErrBodyReadAfterClose
	}
	return b.ReadCloser.Read(p)
}

func (b *oneShotBody) Close() error {
	if b.conn == nil {
		return nil
	}
	err := b.conn.Close()
	b.br.Reset(nil)
	readers.Put(b.br)
	b.conn, b.br = nil, nil
	return err
}

// ctxErr reports a failed exchange as http.Transport does: once the
// request's context is done, as that.
func ctxErr(ctx context.Context, err error) error {
	switch {
	case ctx.Err() != nil:
		return context.Cause(ctx)
	case expired(ctx):
		// The connection's deadline, the context's, passed a moment
		// before the context noticed.
		return context.DeadlineExceeded
	}
	return err
}

// expired says whether ctx's deadline has passed, whether or not its timer
// has fired yet.
func expired(ctx context.Context) bool {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && ctx.Err() == nil && !time.Now().Before(dl)
}

// dialAddr is the URL's host and port, 80 when it names none.
func dialAddr(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = "80"
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// plainRequest says whether oneShot may write req itself: an ASCII host
// and header fields http.Transport would accept (it refuses the others
// with an error of its own, which the probe then reports).
func plainRequest(req *http.Request) bool {
	for i := 0; i < len(req.URL.Host); i++ {
		if req.URL.Host[i] >= 0x80 {
			return false
		}
	}
	for name, values := range req.Header {
		if !validFieldName(name) {
			return false
		}
		for _, v := range values {
			if !validFieldValue(v) {
				return false
			}
		}
	}
	return true
}

// validFieldName is RFC 7230's token, as httpguts.ValidHeaderFieldName.
func validFieldName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// validFieldValue refuses control characters other than tab, as
// httpguts.ValidHeaderFieldValue.
func validFieldValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}
