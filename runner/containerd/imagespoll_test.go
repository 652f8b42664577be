package containerd

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
)

// An images dir that cannot be watched (the host's inotify instances are
// used up) is looked at every pollImagesEvery instead: a tarball put there
// is still imported once it has settled.
func TestImagesDirPolledWithoutInotify(t *testing.T) {
	saved := newImagesWatcher
	newImagesWatcher = func() (*fsnotify.Watcher, error) { return nil, syscall.EMFILE }
	defer func() { newImagesWatcher = saved }()
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	events, errs, closeWatch := watchOrPoll(ctx, dir, testLogger(t))
	defer closeWatch()
	settled := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- watchLoop(ctx, events, errs, func(p string) { settled <- p }, testLogger(t)) }()
	tar := filepath.Join(dir, "app.tar")
	if err := os.WriteFile(tar, []byte("not read here"), 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-settled:
		if p != tar {
			t.Errorf("settled %s, want %s", p, tar)
		}
	case <-time.After(4 * pollImagesEvery):
		t.Fatal("the tarball was never seen")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("watchLoop: %v", err)
	}
}
