package testenv

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"
)

// StartBus runs a private dbus-daemon for the test and returns its
// address: a real bus, on which a test plays logind and systemd
// (ServeLogind). Require's rule applies to dbus-daemon.
func StartBus(t testing.TB) string {
	t.Helper()
	_, err := exec.LookPath("dbus-daemon")
	Require(t, err == nil, "dbus-daemon on PATH (apt-get install dbus-daemon)")
	dir := ShortTempDir(t)
	conf := filepath.Join(dir, "bus.conf")
	WriteFile(t, conf, `<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:path=`+filepath.Join(dir, "bus")+`</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow send_destination="*"/>
    <allow receive_sender="*"/>
    <allow own="*"/>
  </policy>
</busconfig>
`)
	cmd := exec.Command("dbus-daemon", "--config-file="+conf, "--nofork", "--print-address")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	addr, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("dbus-daemon's address: %v", err)
	}
	return strings.TrimSpace(addr)
}

// The names FakeLogind answers to.
const (
	logindObject    = dbus.ObjectPath("/org/freedesktop/login1")
	logindInterface = "org.freedesktop.login1.Manager"
)

// FakeLogind is systemd-logind's and systemd's Managers on a test bus, as
// far as graceful node shutdown calls them: InhibitDelayMaxUSec, Inhibit
// (a pipe's write end is the lock, released when no other process holds
// an end), systemd's KillUnit, and the PrepareForShutdown signal.
type FakeLogind struct {
	conn  *dbus.Conn
	mu    sync.Mutex
	calls []string
	delay uint64          // InhibitDelayMaxUSec
	held  []lockPipe      // the locks handed out, not seen released
	onKil func(sig int32) // what a KillUnit does (the test's logind reload)
}

// ServeLogind owns logind's and systemd's names on the bus at addr, with
// delay as InhibitDelayMaxSec.
func ServeLogind(t testing.TB, addr string, delay time.Duration) *FakeLogind {
	t.Helper()
	conn, err := dbus.Connect(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	f := &FakeLogind{conn: conn, delay: uint64(delay / time.Microsecond)}
	for _, e := range []struct {
		v     any
		path  dbus.ObjectPath
		iface string
	}{{logindManager{f}, logindObject, logindInterface}, {logindProps{f}, logindObject, "org.freedesktop.DBus.Properties"},
		{systemdManager{f}, "/org/freedesktop/systemd1", "org.freedesktop.systemd1.Manager"}} {
		if err := conn.Export(e.v, e.path, e.iface); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"org.freedesktop.login1", "org.freedesktop.systemd1"} {
		if reply, err := conn.RequestName(name, dbus.NameFlagDoNotQueue); err != nil || reply != dbus.RequestNameReplyPrimaryOwner {
			t.Fatalf("own %s: %v %v", name, reply, err)
		}
	}
	return f
}

// Calls are the method calls received, in order.
func (f *FakeLogind) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// SetDelay sets InhibitDelayMaxSec, as a logind reload would.
func (f *FakeLogind) SetDelay(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.delay = uint64(d / time.Microsecond)
}

// OnKillUnit sets what a KillUnit of systemd-logind does.
func (f *FakeLogind) OnKillUnit(fn func(sig int32)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.onKil = fn
}

// Held is how many delay locks are held: pipes of which some process
// other than logind's own two ends holds an end. Telling a release by EOF
// on the read end would need logind's copy of the write end closed, which
// can only be done once the reply carrying it has left — and nothing says
// when; closing it early hands the client a closed descriptor. A lock in
// flight (in a socket's queue, in no process) or still in dbus-daemon's
// hands shows a moment late: poll for it.
func (f *FakeLogind) Held() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	ends := pipeEnds()
	var still []lockPipe
	for _, p := range f.held {
		if ends[p.ino] > 2 {
			still = append(still, p)
			continue
		}
		p.r.Close()
		p.w.Close()
	}
	f.held = still
	return len(still)
}

// lockPipe is a delay lock: logind's ends of its pipe.
type lockPipe struct {
	r, w *os.File
	ino  uint64
}

// pipeEnds counts, by inode, the descriptors of pipes every process holds.
func pipeEnds() map[uint64]int {
	n := map[uint64]int{}
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, fd := range fds {
		l, err := os.Readlink(fd) // a process may end while being read
		if err != nil || !strings.HasPrefix(l, "pipe:[") {
			continue
		}
		if ino, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(l, "pipe:["), "]"), 10, 64); err == nil {
			n[ino]++
		}
	}
	return n
}

// PrepareForShutdown emits logind's signal: true, a shutdown begins; false,
// it was cancelled.
func (f *FakeLogind) PrepareForShutdown(down bool) error {
	return f.Emit("PrepareForShutdown", down)
}

// Emit emits a signal of logind's Manager.
func (f *FakeLogind) Emit(member string, v bool) error {
	return f.conn.Emit(logindObject, logindInterface+"."+member, v)
}

func (f *FakeLogind) record(c string) {
	f.calls = append(f.calls, c)
}

type logindManager struct{ f *FakeLogind }

func (m logindManager) Inhibit(what, who, why, mode string) (dbus.UnixFD, *dbus.Error) {
	r, w, err := os.Pipe()
	if err != nil {
		return 0, dbus.MakeFailedError(err)
	}
	f := m.f
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record(strings.Join([]string{"Inhibit", what, who, mode}, " "))
	var st syscall.Stat_t
	if err := syscall.Fstat(int(r.Fd()), &st); err != nil {
		return 0, dbus.MakeFailedError(err)
	}
	f.held = append(f.held, lockPipe{r: r, w: w, ino: st.Ino})
	return dbus.UnixFD(w.Fd()), nil
}

type logindProps struct{ f *FakeLogind }

func (p logindProps) Get(iface, name string) (dbus.Variant, *dbus.Error) {
	p.f.mu.Lock()
	defer p.f.mu.Unlock()
	if iface != logindInterface || name != "InhibitDelayMaxUSec" {
		return dbus.Variant{}, dbus.MakeFailedError(fmt.Errorf("no property %s.%s", iface, name))
	}
	return dbus.MakeVariant(p.f.delay), nil
}

type systemdManager struct{ f *FakeLogind }

func (s systemdManager) KillUnit(unit, who string, sig int32) *dbus.Error {
	s.f.mu.Lock()
	s.f.record(fmt.Sprintf("KillUnit %s %s %d", unit, who, sig))
	fn := s.f.onKil
	s.f.mu.Unlock()
	if fn != nil && unit == "systemd-logind.service" {
		fn(sig)
	}
	return nil
}
