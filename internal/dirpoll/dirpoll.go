// Package dirpoll stands in for an inotify watch of directories when the
// host has none to give: inotify instances and watches are counted per
// user, and every root process on the host draws from the same count.
package dirpoll

import (
	"context"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

type stamp struct {
	size  int64
	mtime time.Time
}

// Events looks at the entries of dirs every interval until ctx ends and
// sends, as fsnotify would, a Create for each entry that appeared, a Write
// for each whose size or modification time changed and a Remove for each
// that went. What is there when it is called is the baseline: it is read
// before Events returns, so a change made after the call is seen.
func Events(ctx context.Context, every time.Duration, dirs ...string) <-chan fsnotify.Event {
	out := make(chan fsnotify.Event)
	last := scan(dirs)
	go func() {
		defer close(out)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			now := scan(dirs)
			for _, ev := range diff(last, now) {
				select {
				case out <- ev:
				case <-ctx.Done():
					return
				}
			}
			last = now
		}
	}()
	return out
}

// scan stamps every entry of dirs; a directory that cannot be read has
// none (it may be made later).
func scan(dirs []string) map[string]stamp {
	m := map[string]stamp{}
	for _, d := range dirs {
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			if fi, err := e.Info(); err == nil {
				m[filepath.Join(d, e.Name())] = stamp{fi.Size(), fi.ModTime()}
			}
		}
	}
	return m
}

func diff(last, now map[string]stamp) []fsnotify.Event {
	var evs []fsnotify.Event
	for p, s := range now {
		if old, ok := last[p]; !ok {
			evs = append(evs, fsnotify.Event{Name: p, Op: fsnotify.Create})
		} else if old != s {
			evs = append(evs, fsnotify.Event{Name: p, Op: fsnotify.Write})
		}
	}
	for p := range last {
		if _, ok := now[p]; !ok {
			evs = append(evs, fsnotify.Event{Name: p, Op: fsnotify.Remove})
		}
	}
	return evs
}
