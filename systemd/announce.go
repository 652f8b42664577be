package systemd

import (
	"context"
	"log/slog"
	"time"
)

// Engine is what systemd hears of the node's engine: a leaf, this package
// knows runner only through it.
type Engine interface {
	Ready() <-chan struct{}         // closed once the first reconcile is done
	LoopHealthy() error             // nil while the sync loop turns
	CountsChanged() <-chan struct{} // receives when the pod counts change
	Status() string                 // the pod counts, for systemctl status
}

// HoldStart keeps extending systemd's start timeout until ctx ends: READY=1
// waits for containerd and the first reconcile, which may take longer.
func HoldStart(ctx context.Context, log *slog.Logger) {
	if err := ExtendStartup(ctx, 20*time.Second, time.Minute); err != nil {
		log.Warn("sd_notify", "err", err)
	}
}

// Announce waits for the engine's first reconcile, calls ready (start-up
// is over) and tells systemd, then keeps the watchdog fed and the status
// line at the pod counts until ctx ends.
func Announce(ctx context.Context, engine Engine, log *slog.Logger, ready func()) {
	select {
	case <-ctx.Done():
		return
	case <-engine.Ready():
	}
	ready()
	if _, err := Ready(); err != nil {
		log.Warn("sd_notify", "err", err)
	}
	go watchdog(ctx, engine, log)
	podStatus(ctx, engine, log)
}

// watchdog feeds systemd's watchdog while the sync loop turns. A containerd
// outage does not stop it: restarting noderun would not end one.
func watchdog(ctx context.Context, engine Engine, log *slog.Logger) {
	err := Watchdog(ctx, engine.LoopHealthy, func(err error) {
		log.Warn("not feeding the systemd watchdog", "err", err)
	})
	if err != nil {
		log.Warn("sd_notify watchdog", "err", err)
	}
}

// podStatus keeps systemd's status line (systemctl status) at the pod
// counts, sent when they change.
func podStatus(ctx context.Context, engine Engine, log *slog.Logger) {
	last := ""
	for {
		if s := engine.Status(); s != last {
			if _, err := Status(s); err != nil {
				log.Warn("sd_notify status", "err", err)
			}
			last = s
		}
		select {
		case <-ctx.Done():
			return
		case <-engine.CountsChanged():
		}
	}
}
