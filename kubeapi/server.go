// Package kubeapi serves a read-only slice of the Kubernetes API for this
// node over HTTPS with bearer tokens, so kubectl works against noderun
// unchanged. It reads the engine through Backend and serves pods'
// streaming subresources through Streams; it never imports runner. It also
// serves the root-only status socket (StatusServer). Both answer 503 with
// what startup waits for until Ready.
package kubeapi

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/netutil"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// DefaultPort is the API's port when --api-port is not given. It is none
// of the ports a node may also run Kubernetes components on (noderun
// bootstraps control planes): kube-apiserver 6443 (k3s 6444, rke2 9345),
// kubelet 10250/10255/10248, etcd 2379-2381, kube-proxy 10249/10256,
// kube-controller-manager 10257, cloud-controller-manager 10258,
// kube-scheduler 10259; and it lies below Linux's ephemeral range.
const DefaultPort = 10266

// Backend is what the API reads from the node.
type Backend interface {
	// Pods returns every pod with its current status.
	Pods() []v1.Pod
	// Events returns the kept events, oldest first.
	Events() []v1.Event
	// Changes returns the version of pods and events and a channel closed
	// when either changes after it: watches wait on it, never poll.
	Changes() (version uint64, changed <-chan struct{})
	// Node returns this node as a Node object.
	Node(ctx context.Context) *v1.Node
	// SourceErrors returns each manifest source's current errors.
	SourceErrors() map[string][]error
}

// Streams serves a pod's subresources that stream; the node's implementation lives in stream*.go.
type Streams interface {
	Log(w http.ResponseWriter, r *http.Request, namespace, pod string)
	Exec(w http.ResponseWriter, r *http.Request, namespace, pod string)
	Attach(w http.ResponseWriter, r *http.Request, namespace, pod string)
	PortForward(w http.ResponseWriter, r *http.Request, namespace, pod string)
}

// Server is the API's handler. Until Ready gives it the backend and
// streams, it authenticates requests and answers them 503.
type Server struct {
	creds   *Credentials
	streams Streams
	log     *slog.Logger
	version string
	backend atomic.Pointer[Backend]
	usage   atomic.Pointer[Usage] // ServeUsage
	nodeLog http.Handler          // WithNodeLogs
	waiting atomic.Pointer[string]
	mux     *http.ServeMux
	now     func() time.Time

	pods    *resource[v1.Pod]
	events  *resource[v1.Event]
	metrics *Metrics
	done    chan struct{} // closed when serving ends

	limits       *limiter             // long-running requests per token
	maxConns     int                  // open connections
	writeTimeout time.Duration        // for each write of a long response
	watchTimeout func() time.Duration // a watch without timeoutSeconds
	// created is when each pod was first seen, its creationTimestamp
	// unless it started earlier (an adopted pod); guarded by pods' store.
	created map[types.UID]time.Time
}

// Option sets an optional part of the Server.
type Option func(*Server)

// WithLogger logs what the API refuses and what fails while serving.
func WithLogger(l *slog.Logger) Option { return func(srv *Server) { srv.log = l } }

// WithMetrics serves m on /metrics (with either token).
func WithMetrics(m *Metrics) Option { return func(srv *Server) { srv.metrics = m } }

// WithNodeLogs serves h as the kubelet's node log query, /logs/ (admin
// token only): h gets the path under /logs.
func WithNodeLogs(h http.Handler) Option { return func(srv *Server) { srv.nodeLog = h } }

// WithVersion is noderun's version, reported by /version.
func WithVersion(v string) Option { return func(srv *Server) { srv.version = v } }

// New returns the API handler serving with creds.
func New(creds *Credentials, opts ...Option) *Server {
	s := &Server{creds: creds, log: slog.New(slog.DiscardHandler), version: "dev", now: time.Now,
		created: map[types.UID]time.Time{}, done: make(chan struct{}),
		limits: newLimiter(defaultCaps), maxConns: maxConnections, writeTimeout: writeTimeout, watchTimeout: randomWatchTimeout}
	for _, o := range opts {
		o(s)
	}
	s.pods = podResource(s)
	s.events = eventResource(s)
	if s.metrics != nil {
		s.pods.store.observe = func(c change[v1.Pod]) { s.metrics.observePod(c, s.now()) }
		s.metrics.reg.MustRegister(stateCollector{s})
	}
	s.mux = s.routes()
	return s
}

// Ready hands the server the node's backend and the streams that serve
// logs, exec, attach and port-forward (with nil, those answer 404);
// requests are served from then on, and the stores follow the backend's
// changes (for watches that resume and for the pod start metric) until
// serving ends.
func (s *Server) Ready(b Backend, streams Streams) {
	s.streams = streams // read only once backend is set: Store publishes it
	s.backend.Store(&b)
	go s.follow()
}

// follow brings the stores up to date at each change of the backend: it
// sleeps while nothing changes.
func (s *Server) follow() {
	for {
		_, changed := s.be().Changes()
		s.sync()
		synced := time.Now()
		select {
		case <-changed:
		case <-s.done:
			return
		}
		if wait := followEvery - time.Since(synced); wait > 0 {
			timer := time.NewTimer(wait)
			select {
			case <-timer.C:
			case <-s.done:
				timer.Stop()
				return
			}
		}
	}
}

// followEvery is the shortest time between two of follow's syncs. A pod's
// start is several changes and a burst of pods is many, and each sync lists
// every pod and event: one sync per change made a 100-pod burst cost
// noderun an eighth of its CPU. A lone change is still synced at once; open
// watches and reads bring the stores up to date themselves, at each change.
const followEvery = 50 * time.Millisecond

// SetWaiting says, in the 503 answers before Ready, what startup waits for.
func (s *Server) SetWaiting(msg string) { s.waiting.Store(&msg) }

// role is what a request's token allows.
type role int

const (
	roleNone  role = iota
	roleView       // read everything
	roleAdmin      // also exec, attach and port-forward
)

func (s *Server) authenticate(r *http.Request) role {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || tok == "" {
		return roleNone
	}
	switch {
	case subtle.ConstantTimeCompare([]byte(tok), []byte(s.creds.AdminToken)) == 1:
		return roleAdmin
	case subtle.ConstantTimeCompare([]byte(tok), []byte(s.creds.ViewToken)) == 1:
		return roleView
	}
	return roleNone
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	wholeResponseDeadline(w)
	// A browser page must not be able to reach the API, even with a
	// token it somehow holds.
	if r.Header.Get("Origin") != "" {
		writeStatus(w, forbidden("browser requests (with an Origin header) are refused"))
		return
	}
	rl := s.authenticate(r)
	if rl == roleNone {
		writeStatus(w, unauthorized())
		return
	}
	if s.backend.Load() == nil {
		msg := "noderun is starting"
		if m := s.waiting.Load(); m != nil {
			msg += ": " + *m
		}
		writeStatus(w, unavailable(msg))
		return
	}
	s.mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), roleKey{}, rl)))
}

// roleKey holds a request's role in its context, for the routes that
// depend on it.
type roleKey struct{}

func roleOf(r *http.Request) role {
	rl, _ := r.Context().Value(roleKey{}).(role)
	return rl
}

func (s *Server) be() Backend { return *s.backend.Load() }

// sync brings the watched stores up to the backend's version.
func (s *Server) sync() {
	v, _ := s.be().Changes()
	s.pods.store.sync(v)
	s.events.store.sync(v)
}

func (s *Server) routes() *http.ServeMux {
	mux := http.NewServeMux()
	const pod = "/api/v1/namespaces/{namespace}/pods/{name}/"
	// stream serves the subresource sub. Only the admin token may use
	// exec, attach and portforward: they run commands in, or reach into, a
	// pod. The role is checked here, on what the route matched, never on a
	// path parsed again (which decodes an escaped "/" the route did not).
	stream := func(sub string, serve func(Streams, http.ResponseWriter, *http.Request, string, string)) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			ns, name := r.PathValue("namespace"), r.PathValue("name")
			if sub != "log" && roleOf(r) != roleAdmin {
				// Worded as the API server words it.
				st := forbidden(fmt.Sprintf("pods %q is forbidden: the view token cannot %s resource \"pods/%s\" in the namespace %q; use the admin token (noderun kubeconfig --admin)",
					name, strings.ToLower(r.Method), sub, ns))
				st.Details = &metav1.StatusDetails{Name: name, Kind: "pods"}
				writeStatus(w, st)
				return
			}
			if s.streams == nil {
				writeStatus(w, notFoundMsg("this node serves no "+sub))
				return
			}
			if s.findPod(ns, name) == nil {
				writeStatus(w, notFound("pods", name))
				return
			}
			kind := remoteCalls
			if sub == "log" {
				if follow, _ := strconv.ParseBool(r.URL.Query().Get("follow")); !follow {
					serve(s.streams, w, r, ns, name)
					return
				}
				kind = follows
			}
			release, ok := s.limits.acquire(w, roleOf(r), kind)
			if !ok {
				return
			}
			defer release()
			if kind == remoteCalls {
				// The connection is taken over: its streams have idle
				// timeouts of their own, and no deadline of this request
				// may linger on it.
				_ = http.NewResponseController(w).SetWriteDeadline(time.Time{})
			}
			serve(s.streams, w, r, ns, name)
		}
	}
	mux.Handle("GET "+pod+"log", stream("log", Streams.Log))
	for _, m := range []string{"GET ", "POST "} {
		mux.Handle(m+pod+"exec", stream("exec", Streams.Exec))
		mux.Handle(m+pod+"attach", stream("attach", Streams.Attach))
		mux.Handle(m+pod+"portforward", stream("portforward", Streams.PortForward))
	}
	s.debugRoutes(mux)
	s.podWriteRoutes(mux)
	s.readRoutes(mux)
	s.usageRoutes(mux)
	s.nodeLogRoutes(mux)
	if s.metrics != nil {
		mux.Handle("GET /metrics", s.metrics.handler())
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeStatus(w, notFoundMsg("the server could not find the requested resource"))
	})
	return mux
}

// findPod returns the pod namespace/name, or nil.
func (s *Server) findPod(namespace, name string) *v1.Pod {
	for _, p := range s.be().Pods() {
		if p.Namespace == namespace && p.Name == name {
			return &p
		}
	}
	return nil
}

// Listen opens the API's TCP listener on address:port (port 0: one the
// kernel picks).
func Listen(address string, port int) (net.Listener, error) {
	return net.Listen("tcp", net.JoinHostPort(address, strconv.Itoa(port)))
}

// IsLoopback reports whether address reaches only this machine.
func IsLoopback(address string) bool {
	if address == "localhost" {
		return true
	}
	ip := net.ParseIP(address)
	return ip != nil && ip.IsLoopback()
}

// Serve serves the API over TLS on l until the returned close function is
// called. Plain HTTP on the port is refused by the TLS handshake.
func (s *Server) Serve(l net.Listener) (closeFn func() error) {
	srv := &http.Server{
		Handler: s,
		TLSConfig: &tls.Config{
			MinVersion:   tls.VersionTLS12,
			Certificates: []tls.Certificate{s.creds.Cert},
		},
		ReadHeaderTimeout: 10 * time.Second,
		// No write timeout: watches, logs -f and exec sessions last. Each
		// answer sets deadlines of its own (writeTimeout).
		IdleTimeout:    2 * time.Minute,
		MaxHeaderBytes: maxHeaderBytes,
		HTTP2: &http.HTTP2Config{
			// Only the few writes read a body (at most 3 MiB, readBody):
			// what a client sends is held only up to HTTP/2's smallest
			// windows, 64 KiB a connection.
			MaxReceiveBufferPerConnection: 64 << 10,
			MaxReceiveBufferPerStream:     64 << 10,
			// A connection nothing can be written to is closed.
			WriteByteTimeout: writeTimeout,
		},
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	l = netutil.LimitListener(l, s.maxConns)
	go func() {
		if err := srv.ServeTLS(l, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("kubernetes API", "err", err)
		}
	}()
	var once sync.Once
	return func() error {
		once.Do(func() { close(s.done) })
		return srv.Close()
	}
}
