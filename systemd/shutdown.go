package systemd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"k8s.io/utils/clock"

	"github.com/noderun/noderun/internal/atomicfile"
)

// Graceful node shutdown, as the kubelet's pkg/kubelet/nodeshutdown: a
// logind delay lock holds a poweroff or reboot up while the pods stop.
const (
	// DefaultLogindDropIns is where logind reads drop-ins; the kubelet
	// writes its own there (99-kubelet.conf).
	DefaultLogindDropIns = "/etc/systemd/logind.conf.d"
	logindDropIn         = "99-noderun.conf"
	// reconnectDelay is the kubelet's dbusReconnectPeriod: how soon a
	// lost bus is tried again.
	reconnectDelay = time.Second
	// reloadWait bounds the wait for logind to read its configuration
	// again after SIGHUP (it does so asynchronously).
	reloadWait = 5 * time.Second
)

// ShutdownPods is what a node shutdown does to the pods: the engine.
type ShutdownPods interface {
	// Shutdown stops the pods, regular ones within grace less critical,
	// then critical ones within critical, and returns when they have
	// stopped or the periods passed.
	Shutdown(ctx context.Context, grace, critical time.Duration)
	// CancelShutdown: the shutdown was called off.
	CancelShutdown()
}

// ShutdownConfig is graceful node shutdown's configuration: the kubelet's
// shutdownGracePeriod and shutdownGracePeriodCriticalPods (off when the
// grace period is 0).
type ShutdownConfig struct {
	GracePeriod, CriticalPeriod time.Duration
	DropInDir                   string // default DefaultLogindDropIns
	Bus                         string // D-Bus address; default the system bus
	Logger                      *slog.Logger
	Clock                       clock.Clock // default the real one
}

// WatchShutdown holds logind's shutdown delay lock and, when a shutdown
// begins, stops the pods before it lets the shutdown go on, until ctx
// ends. Without logind (no systemd, a container) it logs once and
// returns: the node then shuts down without stopping pods first.
func WatchShutdown(ctx context.Context, cfg ShutdownConfig, pods ShutdownPods) {
	if cfg.GracePeriod <= 0 {
		return
	}
	w := &shutdownWatch{cfg: cfg, pods: pods, dial: dialLogind}
	w.run(ctx)
}

type shutdownWatch struct {
	cfg  ShutdownConfig
	pods ShutdownPods
	dial func(address string) (logind, error)
}

func (w *shutdownWatch) log() *slog.Logger {
	if w.cfg.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return w.cfg.Logger
}

func (w *shutdownWatch) clock() clock.Clock {
	if w.cfg.Clock == nil {
		return clock.RealClock{}
	}
	return w.cfg.Clock
}

// run arms the watch; a bus lost after it worked is tried again every
// second, as the kubelet does, the failures logged once per loss.
func (w *shutdownWatch) run(ctx context.Context) {
	armed, err := w.watch(ctx)
	if !armed {
		if ctx.Err() == nil {
			w.log().Warn("graceful node shutdown unavailable: the node will shut down without stopping pods first", "err", err)
		}
		return
	}
	for ctx.Err() == nil {
		w.log().Warn("graceful node shutdown: logind's watch ended; reconnecting", "err", err)
		logged := false
		for ctx.Err() == nil {
			select {
			case <-ctx.Done():
				return
			case <-w.clock().After(reconnectDelay):
			}
			if armed, err = w.watch(ctx); armed {
				break
			}
			if !logged {
				w.log().Warn("graceful node shutdown: reconnect failed; trying every second", "err", err)
				logged = true
			}
		}
	}
}

// watch takes the lock and follows logind until the bus is lost or ctx
// ends; armed says whether it got that far.
func (w *shutdownWatch) watch(ctx context.Context) (armed bool, err error) {
	l, err := w.dial(w.cfg.Bus)
	if err != nil {
		return false, err
	}
	defer l.Close()
	if err := w.raiseDelay(ctx, l); err != nil {
		return false, err
	}
	lock, err := l.InhibitShutdown()
	if err != nil {
		return false, err
	}
	defer func() { closeLock(lock) }()
	events, err := l.PrepareForShutdown()
	if err != nil {
		return false, err
	}
	w.log().Info("graceful node shutdown armed", "shutdown-grace-period", w.cfg.GracePeriod,
		"shutdown-grace-period-critical-pods", w.cfg.CriticalPeriod)
	for {
		select {
		case <-ctx.Done():
			return true, nil
		case down, ok := <-events:
			if !ok {
				return true, errors.New("the bus connection ended")
			}
			if lock, err = w.event(ctx, l, down, lock); err != nil {
				return true, err
			}
		}
	}
}

// event handles one PrepareForShutdown: true stops the pods, then
// releases the lock so that the shutdown goes on; false (cancelled)
// takes the lock again. It returns the lock now held.
func (w *shutdownWatch) event(ctx context.Context, l logind, down bool, lock io.Closer) (io.Closer, error) {
	if !down {
		w.log().Info("node shutdown cancelled")
		w.pods.CancelShutdown()
		if lock != nil {
			return lock, nil
		}
		return l.InhibitShutdown()
	}
	w.log().Info("node shutting down: stopping pods", "grace", w.cfg.GracePeriod, "critical", w.cfg.CriticalPeriod)
	began := w.clock().Now()
	w.pods.Shutdown(ctx, w.cfg.GracePeriod, w.cfg.CriticalPeriod)
	closeLock(lock)
	w.log().Info("pods stopped; the node may shut down", "took", w.clock().Since(began).Round(time.Millisecond))
	return nil, nil
}

func closeLock(lock io.Closer) {
	if lock != nil {
		_ = lock.Close()
	}
}

// raiseDelay makes logind's InhibitDelayMaxSec at least the grace period,
// as the kubelet does: a drop-in, then logind told to read it again.
func (w *shutdownWatch) raiseDelay(ctx context.Context, l logind) error {
	cur, err := l.InhibitDelayMax()
	if err != nil || cur >= w.cfg.GracePeriod {
		return err
	}
	dir := w.cfg.DropInDir
	if dir == "" {
		dir = DefaultLogindDropIns
	}
	path, err := writeLogindDropIn(dir, w.cfg.GracePeriod)
	if err != nil {
		return err
	}
	if err := l.ReloadLogind(); err != nil {
		return err
	}
	deadline := w.clock().Now().Add(reloadWait)
	for {
		if cur, err = l.InhibitDelayMax(); err != nil || cur >= w.cfg.GracePeriod {
			if err == nil {
				w.log().Info("raised logind's InhibitDelayMaxSec", "to", cur, "drop-in", path)
			}
			return err
		}
		if !w.clock().Now().Before(deadline) {
			return fmt.Errorf("logind's InhibitDelayMaxSec is %s after %s: less than --shutdown-grace-period %s", cur, path, w.cfg.GracePeriod)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-w.clock().After(100 * time.Millisecond):
		}
	}
}

// writeLogindDropIn writes the drop-in that sets InhibitDelayMaxSec to
// grace (whole seconds, rounded as the kubelet's) and returns its path.
func writeLogindDropIn(dir string, grace time.Duration) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(dir, logindDropIn)
	text := fmt.Sprintf("# noderun: --shutdown-grace-period (graceful node shutdown)\n[Login]\nInhibitDelayMaxSec=%.0f\n", grace.Seconds())
	if err := atomicfile.WriteFile(path, []byte(text), 0o644); err != nil {
		return "", fmt.Errorf("write logind drop-in: %w", err)
	}
	return path, nil
}

// RemoveLogindDropIn removes the drop-in graceful node shutdown wrote in
// dir (DefaultLogindDropIns when empty), for reset, and asks logind to
// read its configuration again; without logind the removal stands
// alone. It returns the path removed, or "" when there was none.
func RemoveLogindDropIn(dir string) (string, error) {
	return removeLogindDropIn(dir, func() error {
		l, err := dialLogind("")
		if err != nil {
			return err
		}
		defer l.Close()
		return l.ReloadLogind()
	})
}

func removeLogindDropIn(dir string, reload func() error) (string, error) {
	if dir == "" {
		dir = DefaultLogindDropIns
	}
	path := filepath.Join(dir, logindDropIn)
	if err := os.Remove(path); errors.Is(err, os.ErrNotExist) {
		return "", nil
	} else if err != nil {
		return "", err
	}
	_ = reload() // logind reads it at its next start otherwise
	return path, nil
}
