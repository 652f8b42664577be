package runner

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/utils/clock"

	"github.com/noderun/noderun/manifests"
)

func TestHealthz(t *testing.T) {
	f := startEngine(t)
	ctx := context.Background()
	if err := f.e.Healthy(ctx); err == nil || !strings.Contains(err.Error(), "first reconcile") {
		t.Fatalf("before the first reconcile: %v, want the reason", err)
	}
	f.send()
	waitFor(t, "ready", func() bool { return f.e.ready.Load() })
	if err := f.e.Healthy(ctx); err != nil {
		t.Fatalf("ready: %v", err)
	}
	f.rt.mu.Lock()
	f.rt.pingErr = errors.New("connection refused")
	f.rt.mu.Unlock()
	if err := f.e.Healthy(ctx); err == nil || !strings.Contains(err.Error(), "containerd: connection refused") {
		t.Fatalf("containerd down: %v, want an error naming containerd", err)
	}
}

// Ready closes with the first reconcile with every source, not before.
func TestReadyClosesAfterFirstReconcile(t *testing.T) {
	f := startEngine(t)
	select {
	case <-f.e.Ready():
		t.Fatal("Ready closed before any source reported")
	default:
	}
	f.send()
	<-f.e.Ready()
	if !f.e.ready.Load() {
		t.Fatal("Ready closed before the engine counts as ready")
	}
}

// steppedClock is the real clock after the wall clock was stepped forward:
// as with time.Since, only a time without a monotonic reading sees the step.
type steppedClock struct {
	clock.RealClock
	step atomic.Int64
}

func (c *steppedClock) Since(t time.Time) time.Duration {
	d := time.Since(t)
	if t == t.Round(0) { // Round(0) strips the monotonic reading
		d += time.Duration(c.step.Load())
	}
	return d
}

// An NTP step forward (an RTC-less board at its first sync) must not make
// the sync loop look stalled.
func TestHealthzIgnoresWallClockStep(t *testing.T) {
	clock := &steppedClock{}
	e := New(Config{StateDir: t.TempDir(), RunDir: t.TempDir(), Clock: clock}, newFakeRuntime(clock), &fakeNetwork{})
	snaps := make(chan manifests.Snapshot)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx, snaps, 1) }()
	defer func() {
		cancel()
		<-done
	}()
	snaps <- manifests.Snapshot{Source: "file:/test"}
	waitFor(t, "ready", func() bool { return e.ready.Load() })
	clock.step.Store(int64(time.Hour))
	if err := e.Healthy(context.Background()); err != nil {
		t.Fatalf("after a wall-clock step: %v, want healthy", err)
	}
}

// A loop stuck for three resync intervals fails LoopHealthy, the judgement
// the systemd watchdog and the healthz port share, and passes again once it
// turns. The loop is stuck on the engine's lock, held here, as a deadlock
// would hold it; time is the fake clock's.
func TestLoopHealthyFailsWhileTheLoopIsStuck(t *testing.T) {
	f := startEngine(t)
	f.send()
	<-f.e.Ready()
	f.waitLoop(t)
	f.e.mu.Lock()
	f.send() // taken by the loop, which then waits for the lock
	f.clock.Advance(3*f.e.cfg.Resync + time.Second)
	err := f.e.LoopHealthy()
	f.e.mu.Unlock()
	if err == nil || !strings.Contains(err.Error(), "sync loop stalled for 3m1s") {
		t.Fatalf("stuck for 3m1s: %v, want the stall named", err)
	}
	waitFor(t, "the loop to turn again", func() bool { return f.e.LoopHealthy() == nil })
}
