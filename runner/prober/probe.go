// Package prober makes the kubelet's container probes and lifecycle hooks:
// httpGet, tcpSocket and grpc from noderun's own process, exec through an
// Execer (the container runtime), and one worker per probe that runs it on
// the kubelet's schedule and keeps its result per container run.
package prober

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/noderun/noderun/internal/expansion"
)

// Result is what one probe attempt concluded.
type Result int

const (
	Unknown Result = iota
	Success
	Failure
)

func (r Result) String() string {
	switch r {
	case Success:
		return "Success"
	case Failure:
		return "Failure"
	}
	return "Unknown"
}

// Execer runs a command in a container and waits for it; with timeout > 0
// the process is killed then and timedOut is set.
type Execer func(ctx context.Context, containerID string, cmd []string, timeout time.Duration) (output []byte, exitCode int, timedOut bool, err error)

// Target is the container run a probe or hook is aimed at.
type Target struct {
	PodIP       string // host for httpGet, tcpSocket and grpc unless the handler names one
	ContainerID string // for exec
	Container   *v1.Container
}

// userAgent is what the kubelet sends, so servers that special-case probes
// see the same.
const userAgent = "kube-probe/1.31"

// execGrace is how long past its timeout an exec probe may take to be
// killed and reaped before the attempt is given up.
const execGrace = 10 * time.Second

// maxBody is how much of a probe's HTTP response body is read, the kubelet's
// limit.
const maxBody = 10 * 1024

// Do runs one attempt of h with timeout. The message says why it failed, in
// the kubelet's words, for the Unhealthy event. An error means the attempt
// could not be made at all (the kubelet throws such results away).
func Do(ctx context.Context, h *v1.ProbeHandler, timeout time.Duration, t Target, exec Execer) (Result, string, error) {
	if h.Exec != nil {
		// The runtime kills the process at the timeout and says so; the
		// context only bounds a runtime that does not answer.
		ctx, cancel := context.WithTimeout(ctx, timeout+execGrace)
		defer cancel()
		return doExec(ctx, h.Exec.Command, timeout, t, exec)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	switch {
	case h.HTTPGet != nil:
		return doHTTP(ctx, h.HTTPGet, t)
	case h.TCPSocket != nil:
		return doTCP(ctx, h.TCPSocket, t)
	case h.GRPC != nil:
		return doGRPC(ctx, h.GRPC, timeout, t)
	}
	return Unknown, "", errors.New("probe has no handler")
}

func doExec(ctx context.Context, cmd []string, timeout time.Duration, t Target, exec Execer) (Result, string, error) {
	cmd = expandStatic(cmd, t.Container)
	out, code, timedOut, err := exec(ctx, t.ContainerID, cmd, timeout)
	switch {
	case timedOut:
		return Failure, fmt.Sprintf("command %q timed out", strings.Join(cmd, " ")), nil
	case err != nil:
		return Unknown, "", err
	case code != 0:
		return Failure, string(out), nil
	}
	return Success, string(out), nil
}

// expandStatic replaces $(VAR) in a probe's command with the container's
// literal env values only, as the kubelet does for probes and hooks.
func expandStatic(cmd []string, c *v1.Container) []string {
	if c == nil {
		return cmd
	}
	vars := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			vars[e.Name] = e.Value
		}
	}
	out := make([]string, len(cmd))
	for i, s := range cmd {
		out[i] = expansion.Expand(s, func(n string) (string, bool) { v, ok := vars[n]; return v, ok })
	}
	return out
}

// hostPort is where a probe connects: the handler's host or the pod IP,
// and the port by number or by the container's port name.
func hostPort(host string, port intstr.IntOrString, t Target) (string, error) {
	if host == "" {
		host = t.PodIP
	}
	p, err := resolvePort(port, t.Container)
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(host, strconv.Itoa(p)), nil
}

func resolvePort(port intstr.IntOrString, c *v1.Container) (int, error) {
	if port.Type == intstr.Int {
		if p := port.IntValue(); p > 0 && p < 65536 {
			return p, nil
		}
		return 0, fmt.Errorf("invalid port number: %v", port.IntValue())
	}
	if c != nil {
		for _, p := range c.Ports {
			if p.Name == port.StrVal {
				return int(p.ContainerPort), nil
			}
		}
	}
	return 0, fmt.Errorf("couldn't find port: %v in %v", port.StrVal, containerName(c))
}

func containerName(c *v1.Container) string {
	if c == nil {
		return ""
	}
	return c.Name
}

// newTransport is a probe's HTTP transport: no keep-alives (each probe is a
// fresh connection, as the kubelet makes them), no certificate checks.
func newTransport() *http.Transport {
	return &http.Transport{
		TLSClientConfig:    &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the kubelet does not verify probes either
		DisableKeepAlives:  true,
		DisableCompression: true,
		Proxy:              nil,
	}
}

// sharedTransport serves every HTTP probe and hook: without keep-alives it
// holds no connections, only its settings.
var sharedTransport = newTransport()

// redirectChecker follows redirects to the same host (at most 10) and
// stops at one to another host, whose 3xx then answers the probe.
func redirectChecker(req *http.Request, via []*http.Request) error {
	if req.URL.Hostname() != via[0].URL.Hostname() {
		return http.ErrUseLastResponse
	}
	if len(via) >= 10 {
		return errors.New("stopped after 10 redirects")
	}
	return nil
}

func httpRequest(ctx context.Context, h *v1.HTTPGetAction, t Target) (*http.Request, error) {
	addr, err := hostPort(h.Host, h.Port, t)
	if err != nil {
		return nil, err
	}
	scheme := strings.ToLower(string(h.Scheme))
	if scheme == "" {
		scheme = "http"
	}
	path := h.Path
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	u, err := url.Parse(scheme + "://" + addr + path)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	for _, hdr := range h.HTTPHeaders {
		req.Header.Add(hdr.Name, hdr.Value)
	}
	if req.Header.Get("User-Agent") == "" {
		req.Header.Set("User-Agent", userAgent)
	}
	if req.Header.Get("Accept") == "" {
		req.Header.Set("Accept", "*/*")
	}
	if host := req.Header.Get("Host"); host != "" {
		req.Host = host
	}
	return req, nil
}

func doHTTP(ctx context.Context, h *v1.HTTPGetAction, t Target) (Result, string, error) {
	req, err := httpRequest(ctx, h, t)
	if err != nil {
		return Unknown, "", err
	}
	if req.URL.Scheme == "http" && plainHeaders(req) {
		if res, msg, ok := doHTTPDirect(ctx, req); ok {
			return res, msg, nil
		}
	}
	client := http.Client{Transport: sharedTransport, CheckRedirect: redirectChecker}
	resp, err := client.Do(req)
	if err != nil {
		return Failure, err.Error(), nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	body := string(b)
	switch {
	case resp.StatusCode >= http.StatusMultipleChoices && resp.StatusCode < http.StatusBadRequest:
		// A redirect not followed (another host): the kubelet's Warning,
		// which counts as success.
		return Success, "Probe terminated redirects, Response body: " + body, nil
	case resp.StatusCode >= http.StatusOK && resp.StatusCode < http.StatusBadRequest:
		return Success, body, nil
	}
	return Failure, fmt.Sprintf("HTTP probe failed with statuscode: %d", resp.StatusCode), nil
}

// doHTTPDirect makes a plain-HTTP probe on one fresh connection: the
// request written by hand, the response read with http.ReadResponse. It is
// what http.Transport does for a probe, without its per-connection
// goroutines and dial queue, which cost more CPU than the exchange itself
// (about half, measured). A redirect is left to the full client (ok false),
// which applies the kubelet's redirect rules.
func doHTTPDirect(ctx context.Context, req *http.Request) (Result, string, bool) {
	conn, err := probeDialer.DialContext(ctx, "tcp", req.URL.Host)
	if err != nil {
		return Failure, (&url.Error{Op: "Get", URL: req.URL.String(), Err: err}).Error(), true
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	br := readers.Get().(*bufio.Reader)
	defer readers.Put(br)
	br.Reset(conn)
	var b strings.Builder
	b.WriteString("GET ")
	b.WriteString(req.URL.RequestURI())
	b.WriteString(" HTTP/1.1\r\nHost: ")
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	b.WriteString(host)
	b.WriteString("\r\n")
	for name, values := range req.Header {
		if name == "Host" {
			continue
		}
		for _, v := range values {
			b.WriteString(name)
			b.WriteString(": ")
			b.WriteString(v)
			b.WriteString("\r\n")
		}
	}
	b.WriteString("Connection: close\r\n\r\n")
	if _, err := io.WriteString(conn, b.String()); err != nil {
		return Failure, (&url.Error{Op: "Get", URL: req.URL.String(), Err: err}).Error(), true
	}
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return Failure, (&url.Error{Op: "Get", URL: req.URL.String(), Err: err}).Error(), true
	}
	defer resp.Body.Close()
	switch code := resp.StatusCode; {
	case code >= http.StatusMultipleChoices && code < http.StatusBadRequest:
		return Unknown, "", false
	case code >= http.StatusOK:
		if code < http.StatusBadRequest {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, maxBody))
			return Success, string(body), true
		}
	}
	return Failure, fmt.Sprintf("HTTP probe failed with statuscode: %d", resp.StatusCode), true
}

// probeDialer makes a probe's connection: no TCP keep-alive, which a
// connection that lives for one request never needs and which costs
// three setsockopt calls per probe.
var probeDialer = net.Dialer{KeepAlive: -1}

// readers are reused between probes: each is 4 KiB.
var readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 4096) }}

// plainHeaders reports whether the request's headers can be written as
// they are: no line breaks (the full client refuses those).
func plainHeaders(req *http.Request) bool {
	for name, values := range req.Header {
		for _, v := range append([]string{name, req.Host}, values...) {
			if strings.ContainsAny(v, "\r\n") {
				return false
			}
		}
	}
	return true
}

func doTCP(ctx context.Context, h *v1.TCPSocketAction, t Target) (Result, string, error) {
	addr, err := hostPort(h.Host, h.Port, t)
	if err != nil {
		return Unknown, "", err
	}
	conn, err := probeDialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return Failure, err.Error(), nil
	}
	conn.Close()
	return Success, "", nil
}

func doGRPC(ctx context.Context, h *v1.GRPCAction, timeout time.Duration, t Target) (Result, string, error) {
	addr := net.JoinHostPort(t.PodIP, strconv.Itoa(int(h.Port)))
	conn, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUserAgent(userAgent))
	if err != nil {
		return Failure, fmt.Sprintf("timeout: failed to connect service %q within %v: %+v", addr, timeout, err), nil
	}
	defer conn.Close()
	service := ""
	if h.Service != nil {
		service = *h.Service
	}
	ctx = metadata.NewOutgoingContext(ctx, metadata.Pairs("User-Agent", userAgent))
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service}, grpc.WaitForReady(true))
	if err != nil {
		switch st, _ := status.FromError(err); st.Code() {
		case codes.Unimplemented:
			return Failure, fmt.Sprintf("this server does not implement the grpc health protocol (grpc.health.v1.Health): %s", st.Message()), nil
		case codes.DeadlineExceeded:
			return Failure, fmt.Sprintf("timeout: health rpc did not complete within %v", timeout), nil
		}
		return Failure, fmt.Sprintf("error: health rpc probe failed: %+v", err), nil
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return Failure, fmt.Sprintf("service unhealthy (responded with %q)", resp.GetStatus().String()), nil
	}
	return Success, "service healthy", nil
}

// DoHook runs a lifecycle hook until it ends or ctx does. An exec hook
// fails on a non-zero exit; an httpGet hook only when the request cannot be
// made (the kubelet ignores its status code); sleep waits.
func DoHook(ctx context.Context, h *v1.LifecycleHandler, t Target, exec Execer) error {
	switch {
	case h.Exec != nil:
		cmd := expandStatic(h.Exec.Command, t.Container)
		out, code, _, err := exec(ctx, t.ContainerID, cmd, 0)
		if err != nil {
			return fmt.Errorf("exec lifecycle hook (%v) for container %q failed: %w, message: %q", cmd, containerName(t.Container), err, out)
		}
		if code != 0 {
			return fmt.Errorf("exec lifecycle hook (%v) for container %q failed - error: command '%s' exited with %d: %s, message: %q",
				cmd, containerName(t.Container), strings.Join(cmd, " "), code, out, out)
		}
		return nil
	case h.HTTPGet != nil:
		req, err := httpRequest(ctx, h.HTTPGet, t)
		if err != nil {
			return fmt.Errorf("HTTP lifecycle hook (%s) for container %q failed - error: %w", h.HTTPGet.Path, containerName(t.Container), err)
		}
		client := http.Client{Transport: sharedTransport}
		resp, err := client.Do(req)
		if err != nil {
			return fmt.Errorf("HTTP lifecycle hook (%s) for container %q failed - error: %w", h.HTTPGet.Path, containerName(t.Container), err)
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxBody))
		resp.Body.Close()
		return nil
	case h.Sleep != nil:
		timer := time.NewTimer(time.Duration(h.Sleep.Seconds) * time.Second)
		defer timer.Stop()
		select {
		case <-timer.C:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("sleep lifecycle hook (%d) for container %q was interrupted: %w", h.Sleep.Seconds, containerName(t.Container), ctx.Err())
		}
	}
	return errors.New("lifecycle hook has no handler")
}
