package systemd

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// fakeLogind is logind as the watch sees it; calls records what was asked
// in order ("release" when a lock is closed).
type fakeLogind struct {
	mu       sync.Mutex
	delay    time.Duration // InhibitDelayMax
	reloaded time.Duration // what delay becomes after ReloadLogind
	calls    []string
	events   chan bool
	closed   chan struct{}
}

func (f *fakeLogind) record(c string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, c)
}

func (f *fakeLogind) callLog() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

func (f *fakeLogind) InhibitDelayMax() (time.Duration, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "delay "+f.delay.String())
	return f.delay, nil
}

type fakeLock struct{ f *fakeLogind }

func (l fakeLock) Close() error { l.f.record("release"); return nil }

func (f *fakeLogind) InhibitShutdown() (io.Closer, error) {
	f.record("inhibit")
	return fakeLock{f}, nil
}

func (f *fakeLogind) ReloadLogind() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "reload")
	f.delay = f.reloaded
	return nil
}

func (f *fakeLogind) PrepareForShutdown() (<-chan bool, error) {
	f.record("follow")
	return f.events, nil
}

func (f *fakeLogind) Close() error { f.record("close"); close(f.closed); return nil }

// fakePods records Shutdown and CancelShutdown into the same log, so the
// lock's release is seen to come after the pods stopped.
type fakePods struct{ l *fakeLogind }

func (p fakePods) Shutdown(_ context.Context, grace, critical time.Duration) {
	p.l.record("shutdown " + grace.String() + " " + critical.String())
}

func (p fakePods) CancelShutdown() { p.l.record("cancel") }

func waitCalls(t *testing.T, f *fakeLogind, n int) []string {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for len(f.callLog()) < n {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %d calls; have %q", n, f.callLog())
		}
		time.Sleep(time.Millisecond)
	}
	return f.callLog()
}

// The kubelet's sequence: InhibitDelayMaxSec raised by a drop-in and a
// reload, the delay lock taken, logind followed; PrepareForShutdown(true)
// stops the pods, then releases the lock; (false) cancels and takes it
// again; noderun's stop releases it.
func TestWatchShutdown(t *testing.T) {
	dir := t.TempDir()
	f := &fakeLogind{delay: 5 * time.Second, reloaded: 30 * time.Second, events: make(chan bool), closed: make(chan struct{})}
	w := &shutdownWatch{cfg: ShutdownConfig{GracePeriod: 30 * time.Second, CriticalPeriod: 10 * time.Second, DropInDir: dir},
		pods: fakePods{f}, dial: func(string) (logind, error) { return f, nil }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.run(ctx)
	}()
	want := []string{"delay 5s", "reload", "delay 30s", "inhibit", "follow"}
	if got := waitCalls(t, f, len(want)); !slices.Equal(got, want) {
		t.Fatalf("calls %q, want %q", got, want)
	}
	b, err := os.ReadFile(filepath.Join(dir, "99-noderun.conf"))
	if err != nil || !strings.Contains(string(b), "[Login]\nInhibitDelayMaxSec=30\n") {
		t.Errorf("drop-in %q (%v), want [Login] InhibitDelayMaxSec=30", b, err)
	}
	f.events <- true
	want = append(want, "shutdown 30s 10s", "release")
	if got := waitCalls(t, f, len(want)); !slices.Equal(got, want) {
		t.Fatalf("calls %q, want %q", got, want)
	}
	f.events <- false
	want = append(want, "cancel", "inhibit")
	if got := waitCalls(t, f, len(want)); !slices.Equal(got, want) {
		t.Fatalf("calls %q, want %q", got, want)
	}
	cancel()
	<-done
	if got := f.callLog(); !slices.Equal(got, append(want, "release", "close")) {
		t.Errorf("after the stop: calls %q, want the lock released", got)
	}
}

// A delay logind already allows is left alone: no drop-in, no reload.
func TestWatchShutdownKeepsALongerDelay(t *testing.T) {
	dir := t.TempDir()
	f := &fakeLogind{delay: time.Minute, events: make(chan bool), closed: make(chan struct{})}
	w := &shutdownWatch{cfg: ShutdownConfig{GracePeriod: 30 * time.Second, DropInDir: dir},
		pods: fakePods{f}, dial: func(string) (logind, error) { return f, nil }}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go w.run(ctx)
	if got := waitCalls(t, f, 3); !slices.Equal(got, []string{"delay 1m0s", "inhibit", "follow"}) {
		t.Errorf("calls %q", got)
	}
	if _, err := os.Stat(filepath.Join(dir, "99-noderun.conf")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("drop-in written: %v", err)
	}
}

// Without logind the watch logs once and returns: nothing waits on it.
func TestWatchShutdownWithoutLogind(t *testing.T) {
	var buf bytes.Buffer
	dials := 0
	w := &shutdownWatch{cfg: ShutdownConfig{GracePeriod: 30 * time.Second, Logger: slog.New(slog.NewTextHandler(&buf, nil))},
		dial: func(string) (logind, error) { dials++; return nil, errors.New("no such file or directory") }}
	w.run(context.Background())
	if dials != 1 || strings.Count(buf.String(), "graceful node shutdown unavailable") != 1 {
		t.Errorf("%d dials, log %q; want one dial and one warning", dials, buf.String())
	}
	// Off: nothing is dialled at all.
	WatchShutdown(context.Background(), ShutdownConfig{Bus: "unix:path=/nonexistent"}, nil)
}

// A bus lost after the watch worked is dialled again a second later (on
// the watch's clock).
func TestWatchShutdownReconnects(t *testing.T) {
	clock := clocktesting.NewFakeClock(time.Now())
	first := &fakeLogind{delay: time.Minute, events: make(chan bool), closed: make(chan struct{})}
	second := &fakeLogind{delay: time.Minute, events: make(chan bool), closed: make(chan struct{})}
	var mu sync.Mutex
	conns := []*fakeLogind{first, second}
	w := &shutdownWatch{cfg: ShutdownConfig{GracePeriod: 30 * time.Second, Clock: clock}, pods: fakePods{first},
		dial: func(string) (logind, error) {
			mu.Lock()
			defer mu.Unlock()
			l := conns[0]
			conns = conns[1:]
			return l, nil
		}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go w.run(ctx)
	waitCalls(t, first, 3)
	close(first.events) // the bus went away
	<-first.closed
	for !clock.HasWaiters() {
		time.Sleep(time.Millisecond)
	}
	clock.Step(time.Second)
	if got := waitCalls(t, second, 3); !slices.Equal(got, []string{"delay 1m0s", "inhibit", "follow"}) {
		t.Errorf("after the reconnect: calls %q", got)
	}
}

// reset removes the drop-in and has logind read its configuration again;
// with none there, nothing is reloaded.
func TestRemoveLogindDropIn(t *testing.T) {
	dir := t.TempDir()
	path, err := writeLogindDropIn(dir, 45*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	reloads := 0
	reload := func() error { reloads++; return errors.New("no bus") }
	if got, err := removeLogindDropIn(dir, reload); err != nil || got != path || reloads != 1 {
		t.Errorf("removeLogindDropIn = %q, %v after %d reloads; want %s, one reload", got, err, reloads, path)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("drop-in still there: %v", err)
	}
	if got, err := removeLogindDropIn(dir, reload); err != nil || got != "" || reloads != 1 {
		t.Errorf("again: %q, %v, %d reloads; want nothing done", got, err, reloads)
	}
}
