package crilog

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/fsnotify/fsnotify"
	"golang.org/x/sys/unix"
)

// follows is the one inotify instance every follow of the process shares:
// fs.inotify.max_user_instances (128 by default) counts per user, and every
// root process on the host draws from it, so a follow each would let a few
// dozen `kubectl logs -f` starve systemd, udev and `tail -f` of theirs.
var follows = &watchHub{newWatcher: fsnotify.NewWatcher, dirs: map[string]*watchedDir{}}

// watchHub keeps one watch per directory that some follow waits in, with
// the follows waiting there, and wakes the follows of a name on each of
// its events. The instance is closed once nothing is followed.
type watchHub struct {
	newWatcher func() (*fsnotify.Watcher, error)

	mu   sync.Mutex
	w    *fsnotify.Watcher // nil while nothing is followed
	dirs map[string]*watchedDir
}

type watchedDir struct {
	subs     map[*dirSub]struct{}
	dev, ino uint64 // the directory watched
}

// dirSub is one follow's interest in one file of a watched directory.
type dirSub struct {
	dir, name string
	entry     *watchedDir
	// wake holds one token while something happened to the file since the
	// follow last looked; events coalesce, so a slow follow never holds up
	// the others.
	wake chan struct{}
	// created is set by a Create of the file (or anything that may have
	// hidden one, a lost event): the follow checks whether it rotated.
	created bool // under the hub's mu
}

// subscribe watches path's directory, sharing the watch and the instance
// with the other follows.
func (h *watchHub) subscribe(path string) (*dirSub, error) {
	dir, name := filepath.Dir(path), filepath.Base(path)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.w == nil {
		w, err := h.newWatcher()
		if err != nil {
			return nil, fmt.Errorf("crilog: follow: %w", err)
		}
		h.w = w
		go h.dispatch(w)
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		h.closeIfIdle()
		return nil, fmt.Errorf("crilog: follow %s: %w", dir, &os.PathError{Op: "stat", Path: dir, Err: err})
	}
	d := h.dirs[dir]
	if d != nil && (d.dev != st.Dev || d.ino != st.Ino) {
		// Removed and made anew: the watch is on the old directory, kept
		// alive by the follows that have it open.
		_ = h.w.Remove(dir)
		delete(h.dirs, dir)
		d = nil
	}
	if d == nil {
		if err := h.w.Add(dir); err != nil {
			h.closeIfIdle()
			return nil, fmt.Errorf("crilog: follow %s: %w", dir, err)
		}
		d = &watchedDir{subs: map[*dirSub]struct{}{}, dev: st.Dev, ino: st.Ino}
		h.dirs[dir] = d
	}
	s := &dirSub{dir: dir, name: name, entry: d, wake: make(chan struct{}, 1)}
	d.subs[s] = struct{}{}
	return s, nil
}

// unsubscribe ends s; the directory's watch goes with its last follow, and
// the instance with the last watch.
func (h *watchHub) unsubscribe(s *dirSub) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(s.entry.subs, s)
	if len(s.entry.subs) == 0 && h.dirs[s.dir] == s.entry {
		delete(h.dirs, s.dir)
		// Fails only when the kernel dropped the watch already (the
		// directory was removed), which is what is wanted.
		_ = h.w.Remove(s.dir)
	}
	h.closeIfIdle()
}

// closeIfIdle closes the instance when no directory is watched; h.mu is
// held. Close ends dispatch: the channels it reads are closed.
func (h *watchHub) closeIfIdle() {
	if len(h.dirs) == 0 && h.w != nil {
		h.w.Close()
		h.w = nil
	}
}

// takeCreated reports whether the file may have been created anew since
// the last call.
func (h *watchHub) takeCreated(s *dirSub) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := s.created
	s.created = false
	return c
}

// dispatch wakes the follows each event concerns until w is closed.
func (h *watchHub) dispatch(w *fsnotify.Watcher) {
	for {
		select {
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			h.mu.Lock()
			if d := h.dirs[filepath.Dir(ev.Name)]; d != nil {
				base := filepath.Base(ev.Name)
				for s := range d.subs {
					if s.name == base {
						s.poke(ev.Has(fsnotify.Create))
					}
				}
			}
			if d := h.dirs[ev.Name]; d != nil && ev.Has(fsnotify.Remove|fsnotify.Rename) {
				// The watched directory itself went, and its watch with it:
				// a follow of a directory made anew at that path watches again.
				delete(h.dirs, ev.Name)
			}
			h.mu.Unlock()
		case _, ok := <-w.Errors:
			if !ok {
				return
			}
			// Events were lost (a queue overflow): every follow looks again.
			h.mu.Lock()
			for _, d := range h.dirs {
				for s := range d.subs {
					s.poke(true)
				}
			}
			h.mu.Unlock()
		}
	}
}

// poke wakes the follow; the hub's mu is held.
func (s *dirSub) poke(created bool) {
	s.created = s.created || created
	select {
	case s.wake <- struct{}{}:
	default:
	}
}
