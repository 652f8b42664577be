package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/noderun/noderun/kubeapi"
)

// serveStatusAPI serves the status API on a unix socket at path until
// stop; the engine's handler comes later (apiHandler.serve).
func serveStatusAPI(path string, log *slog.Logger) (api *apiHandler, stop func() error, err error) {
	l, err := kubeapi.ListenUnix(path)
	if err != nil {
		return nil, nil, fmt.Errorf("status socket: %w", err)
	}
	api = &apiHandler{}
	srv := &http.Server{Handler: api, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("status API", "err", err)
		}
	}()
	return api, srv.Close, nil
}

// apiHandler is the status API: until the engine's handler takes over, it
// answers every request with 503 and what startup waits for.
type apiHandler struct {
	engine  atomic.Pointer[http.Handler]
	waiting atomic.Pointer[string]
}

func (h *apiHandler) serve(engine http.Handler) { h.engine.Store(&engine) }

func (h *apiHandler) setWaiting(msg string) { h.waiting.Store(&msg) }

func (h *apiHandler) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	if e := h.engine.Load(); e != nil {
		(*e).ServeHTTP(rw, r)
		return
	}
	msg := "starting"
	if w := h.waiting.Load(); w != nil {
		msg = *w
	}
	http.Error(rw, msg, http.StatusServiceUnavailable)
}
