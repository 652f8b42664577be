package systemd

import (
	"slices"
	"testing"
	"time"

	"github.com/noderun/noderun/internal/testenv"
)

// busLogind speaks logind's and systemd's D-Bus API as the kubelet does,
// on a real bus: the delay read from InhibitDelayMaxUSec, a "shutdown"
// "delay" lock whose file descriptor is logind's hold (closing it
// releases the shutdown), logind reloaded with SIGHUP through KillUnit,
// PrepareForShutdown followed until the bus goes.
func TestBusLogind(t *testing.T) {
	addr := testenv.StartBus(t)
	fake := testenv.ServeLogind(t, addr, 5*time.Second)
	l, err := dialLogind(addr)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := l.InhibitDelayMax(); err != nil || d != 5*time.Second {
		t.Errorf("InhibitDelayMax() = %s, %v; want 5s", d, err)
	}
	if err := l.ReloadLogind(); err != nil {
		t.Error(err)
	}
	lock, err := l.InhibitShutdown()
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"KillUnit systemd-logind.service all 1", "Inhibit shutdown noderun delay"}; !slices.Equal(fake.Calls(), want) {
		t.Errorf("calls %q, want %q", fake.Calls(), want)
	}
	if n := fake.Held(); n != 1 {
		t.Fatalf("%d locks held after Inhibit, want 1", n)
	}
	if err := lock.Close(); err != nil {
		t.Fatal(err)
	}
	// dbus-daemon drops its copy of the descriptor a moment after it
	// passed it on: the release shows once it has.
	deadline := time.Now().Add(time.Minute)
	for fake.Held() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the lock still held a minute after the close")
		}
		time.Sleep(time.Millisecond)
	}

	events, err := l.PrepareForShutdown()
	if err != nil {
		t.Fatal(err)
	}
	// A signal of another member on the same object is not a shutdown.
	if err := fake.Emit("PrepareForSleep", true); err != nil {
		t.Fatal(err)
	}
	for _, down := range []bool{true, false} {
		if err := fake.PrepareForShutdown(down); err != nil {
			t.Fatal(err)
		}
		if got := <-events; got != down {
			t.Errorf("PrepareForShutdown(%v) read as %v", down, got)
		}
	}
	l.Close()
	if _, ok := <-events; ok {
		t.Error("events still open after the connection closed")
	}
}
