package kubeapi

import (
	"context"
	"log/slog"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
)

// RouteKlog sends what the Kubernetes streaming libraries log through klog
// to noderun's log, at debug level: the one error they log for every
// WebSocket session ("Error on socket receive") is how a session ends when
// the server closes it, and their other messages are answered to clients.
func RouteKlog(log *slog.Logger) {
	klog.SetLogger(logr.FromSlogHandler(debugHandler{log.Handler()}))
}

// debugHandler logs every record at debug level.
type debugHandler struct{ slog.Handler }

func (h debugHandler) Enabled(ctx context.Context, _ slog.Level) bool {
	return h.Handler.Enabled(ctx, slog.LevelDebug)
}

func (h debugHandler) Handle(ctx context.Context, r slog.Record) error {
	if !h.Handler.Enabled(ctx, slog.LevelDebug) {
		return nil // logr does not ask Enabled before an error
	}
	r.Level = slog.LevelDebug
	return h.Handler.Handle(ctx, r)
}

func (h debugHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return debugHandler{h.Handler.WithAttrs(attrs)}
}

func (h debugHandler) WithGroup(name string) slog.Handler {
	return debugHandler{h.Handler.WithGroup(name)}
}
