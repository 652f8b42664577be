package kubeapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/noderun/noderun/crilog"
	"github.com/noderun/noderun/manifests"
)

// StatusBackend is what the status socket reads from the engine.
type StatusBackend interface {
	// Healthy is nil when noderun is ready and containerd answers.
	Healthy(ctx context.Context) error
	Pods() []v1.Pod
	Events() []v1.Event
	// Sources returns what each manifest source last reported.
	Sources() []manifests.SourceInfo
	// LogStreams returns each running container's log stream as the log
	// collector counts it: its dropped records (a full disk).
	LogStreams(ctx context.Context) ([]crilog.StreamStats, error)
}

// ManifestSources is the answer of GET /manifests.
type ManifestSources struct {
	Sources []manifests.SourceInfo `json:"sources"`
}

// StatusServer is the local status API on the unix socket (root-only, no
// tokens), for `noderun pods`, `check`, health checks and profiles. Until
// Ready gives it the backend, it answers every request 503 with what
// startup waits for, so that /healthz tells it.
type StatusServer struct {
	handler atomic.Pointer[http.Handler]
	waiting atomic.Pointer[string]
}

// ServeStatus serves the status API on a unix socket at path until stop.
func ServeStatus(path string, log *slog.Logger) (s *StatusServer, stop func() error, err error) {
	l, err := ListenUnix(path)
	if err != nil {
		return nil, nil, fmt.Errorf("status socket: %w", err)
	}
	s = &StatusServer{}
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("status API", "err", err)
		}
	}()
	return s, srv.Close, nil
}

// Ready hands the server the node's backend; requests are served from then on.
func (s *StatusServer) Ready(b StatusBackend) {
	h := statusHandler(b)
	s.handler.Store(&h)
}

// SetWaiting says, in the 503 answers before Ready, what startup waits for.
func (s *StatusServer) SetWaiting(msg string) { s.waiting.Store(&msg) }

func (s *StatusServer) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	if h := s.handler.Load(); h != nil {
		(*h).ServeHTTP(rw, r)
		return
	}
	msg := "starting"
	if w := s.waiting.Load(); w != nil {
		msg = *w
	}
	http.Error(rw, msg, http.StatusServiceUnavailable)
}

// statusHandler serves the status API's routes from b.
func statusHandler(b StatusBackend) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(rw http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		if err := b.Healthy(ctx); err != nil {
			http.Error(rw, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(rw, "ok")
	})
	mux.HandleFunc("GET /pods", func(rw http.ResponseWriter, r *http.Request) {
		table, include, err := negotiateTable(r)
		if err != nil {
			http.Error(rw, err.Error(), http.StatusNotAcceptable)
			return
		}
		if table {
			writeJSON(rw, http.StatusOK, statusPodTable(b.Pods(), include, time.Now()))
			return
		}
		list := v1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"}, Items: b.Pods()}
		for i := range list.Items {
			list.Items[i].TypeMeta = metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"}
		}
		writeJSON(rw, http.StatusOK, &list)
	})
	mux.HandleFunc("GET /events", func(rw http.ResponseWriter, _ *http.Request) {
		writeJSON(rw, http.StatusOK, &v1.EventList{TypeMeta: metav1.TypeMeta{Kind: "EventList", APIVersion: "v1"}, Items: b.Events()})
	})
	// Every source with what it read, the pods it yields and its errors,
	// so a bad manifest is visible without reading logs.
	mux.HandleFunc("GET /manifests", func(rw http.ResponseWriter, _ *http.Request) {
		writeJSON(rw, http.StatusOK, ManifestSources{Sources: b.Sources()})
	})
	// Each running container's dropped log records (a full disk).
	mux.HandleFunc("GET /logs", func(rw http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		streams, err := b.LogStreams(ctx)
		if err != nil {
			http.Error(rw, err.Error(), http.StatusServiceUnavailable)
			return
		}
		slices.SortFunc(streams, func(a, b crilog.StreamStats) int { return strings.Compare(a.Key, b.Key) })
		writeJSON(rw, http.StatusOK, streams)
	})
	// Profiles for `make bench-profile`; the socket is root-only.
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		// A browser page must not be able to reach the API.
		if r.Header.Get("Origin") != "" {
			http.Error(rw, "browser requests are refused", http.StatusForbidden)
			return
		}
		mux.ServeHTTP(rw, r)
	})
}

// statusPodTable is the pods as the API's pod printer shows them, for
// `noderun pods`. The status socket keeps no first-seen times, so a pod's
// age is from its start, as the API's is for a pod adopted after a restart.
func statusPodTable(pods []v1.Pod, include metav1.IncludeObjectPolicy, now time.Time) *metav1.Table {
	pods = slices.Clone(pods) // the backend's may be shared
	for i := range pods {
		if p := &pods[i]; p.CreationTimestamp.IsZero() && p.Status.StartTime != nil {
			p.CreationTimestamp = *p.Status.StartTime
		}
	}
	res := &resource[v1.Pod]{
		kind: "Pod", columns: podColumns, cells: podCells, conditions: podConditions, now: func() time.Time { return now },
		store: &store[v1.Pod]{meta: func(p *v1.Pod) *metav1.ObjectMeta { return &p.ObjectMeta }},
	}
	return res.table(pods, 0, include)
}

// ListenUnix opens the API socket with mode 0600, replacing a stale one. It
// is made in a fresh directory of mode 0700, chmodded, then renamed into
// place, so whatever the umask it is never reachable with looser
// permissions. (Setting the umask around Listen would also change the mode
// of files other goroutines create meanwhile: the umask is process-wide.)
func ListenUnix(path string) (net.Listener, error) {
	dir := path + ".tmp"
	if err := os.RemoveAll(dir); err != nil { // left by a crash
		return nil, err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	tmp := filepath.Join(dir, "s")
	l, err := net.Listen("unix", tmp)
	if err != nil {
		return nil, err
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	if err := os.Chmod(tmp, 0o600); err != nil {
		l.Close()
		return nil, err
	}
	if err := os.Rename(tmp, path); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}
