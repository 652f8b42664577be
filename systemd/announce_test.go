package systemd

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"
)

type fakeEngine struct {
	ready, changed chan struct{}
	status         chan string
}

func (e *fakeEngine) Ready() <-chan struct{}         { return e.ready }
func (e *fakeEngine) LoopHealthy() error             { return nil }
func (e *fakeEngine) CountsChanged() <-chan struct{} { return e.changed }
func (e *fakeEngine) Status() string                 { return <-e.status }

// Announce says READY=1 only after the engine's first reconcile and ready,
// then follows the pod counts on the status line.
func TestAnnounceReadyThenStatus(t *testing.T) {
	conn := notifySocket(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := &fakeEngine{ready: make(chan struct{}), changed: make(chan struct{}), status: make(chan string, 1)}
	readied := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		Announce(ctx, e, slog.New(slog.NewTextHandler(io.Discard, nil)), func() { close(readied) })
	}()
	if got := receive(t, conn, 100*time.Millisecond); got != "" {
		t.Fatalf("before the first reconcile: got %q", got)
	}
	e.status <- "1 running"
	close(e.ready)
	<-readied
	for _, want := range []string{"READY=1", "STATUS=1 running"} {
		if got := receive(t, conn, 10*time.Second); got != want {
			t.Fatalf("got %q, want %q", got, want)
		}
	}
	e.status <- "2 running"
	e.changed <- struct{}{}
	if got := receive(t, conn, 10*time.Second); got != "STATUS=2 running" {
		t.Fatalf("got %q, want STATUS=2 running", got)
	}
	cancel()
	<-done
}
