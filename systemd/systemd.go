// Package systemd tells systemd about noderun's state (sd_notify) and ships
// its unit file. Outside systemd every call is a no-op.
package systemd

import (
	_ "embed"

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
