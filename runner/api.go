package runner

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Handler is the local status API, in place of the API server.
func (e *Engine) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", e.serveHealthz)
	mux.HandleFunc("GET /pods", e.servePods)
	mux.HandleFunc("GET /events", e.serveEvents)
	mux.HandleFunc("GET /manifests", e.serveManifests)
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

func (e *Engine) serveHealthz(rw http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
	defer cancel()
	if err := e.Healthy(ctx); err != nil {
		http.Error(rw, err.Error(), http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintln(rw, "ok")
}

func (e *Engine) servePods(rw http.ResponseWriter, _ *http.Request) {
	list := v1.PodList{
		TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"},
		Items:    e.Pods(),
	}
	for i := range list.Items {
		list.Items[i].TypeMeta = metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"}
	}
	rw.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(rw).Encode(&list)
}

func (e *Engine) serveEvents(rw http.ResponseWriter, _ *http.Request) {
	list := v1.EventList{TypeMeta: metav1.TypeMeta{Kind: "EventList", APIVersion: "v1"}, Items: e.events.list()}
	rw.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(rw).Encode(&list)
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
