package kubeapi

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// Healthz is the kubelet's healthz port (--healthz-port, plain HTTP) for
// what polls a node agent there, kubeadm first: GET /healthz answers "ok"
// while the sync loop turns and, as the kubelet's, 500 with each check's
// line otherwise, the reason withheld (it is logged). Its checks are the
// kubelet's ping and syncloop; the kubelet's third, log (klog flushes in
// time), has no counterpart: noderun's logger buffers nothing.
type Healthz struct {
	syncLoop atomic.Pointer[func() error]
	failing  atomic.Bool // the last answer failed: only a change is logged
	log      *slog.Logger
}

// healthzCheck is one named check, as the kubelet's healthz.HealthChecker.
type healthzCheck struct {
	name  string
	check func() error
}

// errNotStarted is syncloop's answer before the engine is handed over.
var errNotStarted = errors.New("the sync loop has not started")

// ServeHealthz listens on address:port and serves healthz until stop. Until
// Ready, syncloop fails.
func ServeHealthz(address string, port int, log *slog.Logger) (h *Healthz, stop func() error, err error) {
	l, err := Listen(address, port)
	if err != nil {
		return nil, nil, fmt.Errorf("healthz (--healthz-bind-address, --healthz-port): %w", err)
	}
	h = &Healthz{log: log}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("healthz", "err", err)
		}
	}()
	log.Info("healthz", "url", "http://"+l.Addr().String()+"/healthz")
	return h, srv.Close, nil
}

// Ready gives healthz the sync loop's judgement: the one the systemd
// watchdog is fed by, so the two never disagree.
func (h *Healthz) Ready(syncLoop func() error) { h.syncLoop.Store(&syncLoop) }

func (h *Healthz) checks() []healthzCheck {
	return []healthzCheck{
		{"ping", func() error { return nil }},
		{"syncloop", func() error {
			if f := h.syncLoop.Load(); f != nil {
				return (*f)()
			}
			return errNotStarted
		}},
	}
}

func (h *Healthz) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	rw.Header().Set("Content-Type", "text/plain; charset=utf-8")
	rw.Header().Set("X-Content-Type-Options", "nosniff")
	if r.Header.Get("Origin") != "" { // no TCP listener of noderun answers a browser
		http.Error(rw, "browser requests (with an Origin header) are refused", http.StatusForbidden)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.Error(rw, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if r.URL.Path == "/healthz" {
		h.serveAll(rw, r)
		return
	}
	name, ok := strings.CutPrefix(r.URL.Path, "/healthz/")
	for _, c := range h.checks() {
		if ok && c.name == name {
			if err := c.check(); err != nil {
				http.Error(rw, "internal server error: "+err.Error(), http.StatusInternalServerError)
				return
			}
			fmt.Fprint(rw, "ok")
			return
		}
	}
	http.NotFound(rw, r)
}

// serveAll answers /healthz as the kubelet's: "ok", or with ?verbose or on
// a failure one line per check; ?exclude=name leaves a check out.
func (h *Healthz) serveAll(rw http.ResponseWriter, r *http.Request) {
	exclude := r.URL.Query()["exclude"]
	var out strings.Builder
	var failed []string
	for _, c := range h.checks() {
		if slices.Contains(exclude, c.name) {
			fmt.Fprintf(&out, "[+]%s excluded: ok\n", c.name)
			continue
		}
		if err := c.check(); err != nil {
			fmt.Fprintf(&out, "[-]%s failed: reason withheld\n", c.name)
			failed = append(failed, c.name+": "+err.Error())
			continue
		}
		fmt.Fprintf(&out, "[+]%s ok\n", c.name)
	}
	if was := h.failing.Swap(len(failed) > 0); was != (len(failed) > 0) {
		if len(failed) > 0 {
			h.log.Warn("healthz check failed", "checks", strings.Join(failed, "; "))
		} else {
			h.log.Info("healthz check passes again")
		}
	}
	if len(failed) > 0 {
		out.WriteString("healthz check failed\n")
		http.Error(rw, strings.TrimSuffix(out.String(), "\n"), http.StatusInternalServerError)
		return
	}
	if _, verbose := r.URL.Query()["verbose"]; verbose {
		out.WriteString("healthz check passed\n")
		fmt.Fprint(rw, out.String())
		return
	}
	fmt.Fprint(rw, "ok")
}
