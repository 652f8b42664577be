package dirpoll

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
)

// A file made, grown and removed after Events was called is seen as each,
// in two directories at once; what was there before is the baseline.
func TestEvents(t *testing.T) {
	d1, d2 := t.TempDir(), t.TempDir()
	old := filepath.Join(d1, "old")
	if err := os.WriteFile(old, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	evs := Events(ctx, 10*time.Millisecond, d1, d2, filepath.Join(d1, "missing"))
	next := func(want fsnotify.Event) {
		t.Helper()
		select {
		case ev := <-evs:
			if ev != want {
				t.Errorf("event %v, want %v", ev, want)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("no event; want %v", want)
		}
	}
	// Each change is one step a poll cannot see half done: a file written
	// outside and renamed in, then one appending write (WriteFile's
	// truncate and write could be seen as two writes on a busy machine).
	p, staged := filepath.Join(d2, "new"), filepath.Join(t.TempDir(), "new")
	if err := os.WriteFile(staged, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(staged, p); err != nil {
		t.Fatal(err)
	}
	next(fsnotify.Event{Name: p, Op: fsnotify.Create})
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("y")); err != nil {
		t.Fatal(err)
	}
	f.Close()
	next(fsnotify.Event{Name: p, Op: fsnotify.Write})
	if err := os.Remove(old); err != nil {
		t.Fatal(err)
	}
	next(fsnotify.Event{Name: old, Op: fsnotify.Remove})
	cancel()
	for range evs { // closed once ctx ends
	}
}
