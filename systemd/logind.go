package systemd

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/godbus/dbus/v5"
)

// logind's and systemd's D-Bus names, as the kubelet's
// pkg/kubelet/nodeshutdown/systemd uses them.
const (
	logindService   = "org.freedesktop.login1"
	logindObject    = dbus.ObjectPath("/org/freedesktop/login1")
	logindInterface = "org.freedesktop.login1.Manager"
	systemdService  = "org.freedesktop.systemd1"
	systemdObject   = dbus.ObjectPath("/org/freedesktop/systemd1")
)

// logind is what graceful node shutdown asks of systemd-logind (and of
// systemd, to make logind read its configuration again).
type logind interface {
	// InhibitDelayMax is logind's InhibitDelayMaxSec: how long a delay
	// lock may hold a shutdown up.
	InhibitDelayMax() (time.Duration, error)
	// InhibitShutdown takes a delay lock on shutdown; closing it lets the
	// shutdown go on.
	InhibitShutdown() (io.Closer, error)
	// ReloadLogind sends logind SIGHUP through systemd.
	ReloadLogind() error
	// PrepareForShutdown follows logind's signal: true when a shutdown
	// begins, false when it was cancelled; closed when the bus is lost.
	PrepareForShutdown() (<-chan bool, error)
	Close() error
}

// busLogind is logind over a D-Bus connection. It uses godbus directly,
// as the kubelet does: go-systemd's login1 package covers Inhibit and
// signals but not the Manager's properties, so the raw connection would
// be needed beside it anyway.
type busLogind struct{ conn *dbus.Conn }

var _ logind = (*busLogind)(nil)

// dialLogind connects to the bus at address, the system bus when empty.
func dialLogind(address string) (logind, error) {
	var conn *dbus.Conn
	var err error
	if address == "" {
		conn, err = dbus.ConnectSystemBus()
	} else {
		conn, err = dbus.Connect(address)
	}
	if err != nil {
		return nil, fmt.Errorf("connect to the system bus: %w", err)
	}
	return &busLogind{conn: conn}, nil
}

func (l *busLogind) Close() error { return l.conn.Close() }

func (l *busLogind) InhibitDelayMax() (time.Duration, error) {
	v, err := l.conn.Object(logindService, logindObject).GetProperty(logindInterface + ".InhibitDelayMaxUSec")
	if err != nil {
		return 0, fmt.Errorf("read logind's InhibitDelayMaxUSec: %w", err)
	}
	us, ok := v.Value().(uint64)
	if !ok {
		return 0, fmt.Errorf("logind's InhibitDelayMaxUSec is a %s, not a uint64", v.Signature())
	}
	return time.Duration(us) * time.Microsecond, nil
}

func (l *busLogind) InhibitShutdown() (io.Closer, error) {
	var fd dbus.UnixFD
	err := l.conn.Object(logindService, logindObject).Call(logindInterface+".Inhibit", 0,
		"shutdown", "noderun", "noderun needs time to stop pods before the node shuts down", "delay").Store(&fd)
	if err != nil {
		return nil, fmt.Errorf("take logind's shutdown delay lock: %w", err)
	}
	if fd < 0 {
		return nil, errors.New("take logind's shutdown delay lock: no file descriptor came back")
	}
	return os.NewFile(uintptr(fd), "logind-inhibitor"), nil
}

func (l *busLogind) ReloadLogind() error {
	const sighup = int32(1)
	err := l.conn.Object(systemdService, systemdObject).Call("org.freedesktop.systemd1.Manager.KillUnit", 0,
		"systemd-logind.service", "all", sighup).Err
	if err != nil {
		return fmt.Errorf("reload logind: %w", err)
	}
	return nil
}

func (l *busLogind) PrepareForShutdown() (<-chan bool, error) {
	if err := l.conn.AddMatchSignal(dbus.WithMatchObjectPath(logindObject), dbus.WithMatchInterface(logindInterface),
		dbus.WithMatchMember("PrepareForShutdown")); err != nil {
		return nil, fmt.Errorf("follow logind's PrepareForShutdown: %w", err)
	}
	sigs := make(chan *dbus.Signal, 4)
	l.conn.Signal(sigs)
	out := make(chan bool, 1)
	go func() {
		defer close(out)
		// godbus closes sigs when the connection ends.
		for s := range sigs {
			if s.Name != logindInterface+".PrepareForShutdown" || len(s.Body) == 0 {
				continue
			}
			if down, ok := s.Body[0].(bool); ok {
				out <- down
			}
		}
	}()
	return out, nil
}
