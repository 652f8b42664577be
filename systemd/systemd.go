// Package systemd tells systemd about noderun's state (sd_notify), ships
// its unit file and installs noderun with it (Install), and holds a
// poweroff or reboot up with a logind delay lock while the pods stop
// (WatchShutdown, the kubelet's graceful node shutdown). Outside systemd
// every notification is a no-op and the shutdown watch ends at once.
package systemd

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
)

// Unit is the recommended unit file for noderun.
//
//go:embed noderun.service
var Unit string

// Ready tells systemd that startup finished (Type=notify). It reports
// whether a notification was sent.
func Ready() (bool, error) { return daemon.SdNotify(false, daemon.SdNotifyReady) }

// Stopping tells systemd that noderun is shutting down.
func Stopping() (bool, error) { return daemon.SdNotify(false, daemon.SdNotifyStopping) }

// Status sets the one-line status systemctl shows.
func Status(s string) (bool, error) { return daemon.SdNotify(false, "STATUS="+s) }

// ExtendStartup asks systemd every `every` for `by` more time to start
// (EXTEND_TIMEOUT_USEC, which also holds off the watchdog) until ctx ends:
// noderun is ready only once containerd answers and the first reconcile is
// done, which can take longer than the unit's start timeout.
func ExtendStartup(ctx context.Context, every, by time.Duration) error {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if _, err := daemon.SdNotify(false, fmt.Sprintf("EXTEND_TIMEOUT_USEC=%d", by.Microseconds())); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Watchdog sends WATCHDOG=1 at half the interval systemd asks for
// (WatchdogSec=), but only while healthy returns nil, so that systemd
// restarts a noderun that stopped working; skipped hears why a ping was
// not sent. Without a watchdog it returns at once, else when ctx ends.
func Watchdog(ctx context.Context, healthy func() error, skipped func(error)) error {
	interval, err := daemon.SdWatchdogEnabled(false)
	if err != nil || interval == 0 {
		return err
	}
	t := time.NewTicker(interval / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := healthy(); err != nil {
			skipped(err)
			continue
		}
		if _, err := daemon.SdNotify(false, daemon.SdNotifyWatchdog); err != nil {
			return err
		}
	}
}
