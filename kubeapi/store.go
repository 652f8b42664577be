package kubeapi

import (
	"crypto/sha256"
	"encoding/json"
	"strconv"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

const (
	// historyLen is how many changes a store keeps for watches that resume
	// from a resourceVersion (kubectl get -w watches from its list's), as
	// many as the API server's default watch cache holds: each kept change
	// holds its object, so at 1000 the history of a node's churn was the
	// largest part of noderun's heap. A watch resuming from before it gets
	// 410 Expired and lists again, as with the API server.
	historyLen = 100
	// watcherBuffer is how many changes a watch may fall behind before it
	// is ended (the client then watches again, or, past the history, lists
	// again), as the API server does with a slow watcher rather than letting
	// it hold memory.
	watcherBuffer = 256
)

// store keeps one resource's objects as last served, each with the
// resourceVersion at which it last changed, and the recent changes. A
// resourceVersion is the backend's change counter plus one (0 means "any"
// to clients), so it only grows while noderun runs.
type store[T any] struct {
	list func() []T
	meta func(*T) *metav1.ObjectMeta
	key  func(*T) string
	// observe, if set, sees each change (under the store's lock).
	observe func(change[T])

	mu       sync.Mutex
	synced   bool
	rv       uint64                       // the resourceVersion of the last sync
	items    []T                          // current objects, in the backend's order
	sums     map[string][sha256.Size]byte // each item's JSON digest, to tell a real change from a new stamp
	stamps   map[string]string            // the backend's resourceVersion of each item, as last synced
	byKey    map[string]int               // index into items
	history  []change[T]                  // oldest first
	dropped  uint64                       // history is complete for changes after this rv
	watchers map[*watcher[T]]struct{}
}

// change is one watch event: the object (and for MODIFIED, what it was).
type change[T any] struct {
	typ  watch.EventType
	obj  T
	prev *T
	rv   uint64
}

type watcher[T any] struct {
	ch chan change[T]
}

func newStore[T any](list func() []T, meta func(*T) *metav1.ObjectMeta, key func(*T) string) *store[T] {
	return &store[T]{list: list, meta: meta, key: key, watchers: map[*watcher[T]]struct{}{}}
}

// sync brings the store to the backend's version, recording what changed.
// It is cheap when nothing changed, so every request calls it, and costs a
// marshal only for objects whose backend stamp changed.
func (s *store[T]) sync(version uint64) {
	rv := version + 1
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.synced && rv <= s.rv {
		return
	}
	items := s.list()
	sums := make(map[string][sha256.Size]byte, len(items))
	byKey := make(map[string]int, len(items))
	var changes []change[T]
	stamps := make(map[string]string, len(items))
	for i := range items {
		m := s.meta(&items[i])
		k := s.key(&items[i])
		old, had := s.byKey[k]
		// The backend stamps each object anew at each change (its
		// resourceVersion): an object with the stamp it had is the same,
		// and is not marshalled again. One without a stamp always is.
		stamp := m.ResourceVersion
		if had && stamp != "" && s.stamps[k] == stamp {
			m.ResourceVersion = s.meta(&s.items[old]).ResourceVersion
			sums[k], byKey[k], stamps[k] = s.sums[k], i, stamp
			continue
		}
		m.ResourceVersion = ""
		b, err := json.Marshal(&items[i])
		if err != nil {
			continue // not for types that always marshal
		}
		sum := sha256.Sum256(b)
		sums[k], byKey[k], stamps[k] = sum, i, stamp
		switch {
		case had && s.sums[k] == sum:
			m.ResourceVersion = s.meta(&s.items[old]).ResourceVersion
		case had:
			m.ResourceVersion = strconv.FormatUint(rv, 10)
			prev := s.items[old]
			changes = append(changes, change[T]{typ: watch.Modified, obj: items[i], prev: &prev, rv: rv})
		default:
			m.ResourceVersion = strconv.FormatUint(rv, 10)
			changes = append(changes, change[T]{typ: watch.Added, obj: items[i], rv: rv})
		}
	}
	for k, i := range s.byKey {
		if _, ok := byKey[k]; !ok {
			gone := s.items[i]
			s.meta(&gone).ResourceVersion = strconv.FormatUint(rv, 10)
			changes = append(changes, change[T]{typ: watch.Deleted, obj: gone, rv: rv})
		}
	}
	s.items, s.sums, s.byKey, s.stamps, s.rv = items, sums, byKey, stamps, rv
	if !s.synced {
		// What was there at the start is no change.
		s.synced, s.dropped = true, rv
		return
	}
	if s.observe != nil {
		for _, c := range changes {
			s.observe(c)
		}
	}
	s.history = append(s.history, changes...)
	if over := len(s.history) - historyLen; over > 0 {
		s.dropped = s.history[over-1].rv
		s.history = append(s.history[:0:0], s.history[over:]...)
	}
	for w := range s.watchers {
		for _, c := range changes {
			select {
			case w.ch <- c:
			default: // too slow: end it
				s.end(w)
			}
			if _, ok := s.watchers[w]; !ok {
				break
			}
		}
	}
}

// snapshot returns the current objects and the resourceVersion of the list.
func (s *store[T]) snapshot() ([]T, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]T(nil), s.items...), s.rv
}

// errExpired: a watch from a resourceVersion older than the kept history.
type errExpired struct{ rv, oldest uint64 }

// watch starts a watch: the changes to replay first, and the watcher for
// the rest. From "" or "0": every current object as ADDED (the API
// server's synthetic events); from a resourceVersion: the changes after it.
// at is the resourceVersion the store was at when the watch began.
func (s *store[T]) watch(from uint64) (initial []change[T], w *watcher[T], at uint64, expired *errExpired) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case from == 0:
		for _, it := range s.items {
			rv, _ := strconv.ParseUint(s.meta(&it).ResourceVersion, 10, 64)
			initial = append(initial, change[T]{typ: watch.Added, obj: it, rv: rv})
		}
	case from < s.dropped:
		return nil, nil, s.rv, &errExpired{rv: from, oldest: s.dropped}
	default:
		for _, c := range s.history {
			if c.rv > from {
				initial = append(initial, c)
			}
		}
	}
	w = &watcher[T]{ch: make(chan change[T], watcherBuffer)}
	s.watchers[w] = struct{}{}
	return initial, w, s.rv, nil
}

func (s *store[T]) stopWatch(w *watcher[T]) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.watchers[w]; ok {
		s.end(w)
	}
}

// end closes a watcher's channel and drops the changes queued in it: a
// watch too slow to take them may be stuck writing for a long while, and
// would hold them (each an object and its previous version) until then.
func (s *store[T]) end(w *watcher[T]) {
	delete(s.watchers, w)
	for drained := false; !drained; {
		select {
		case <-w.ch:
		default:
			drained = true
		}
	}
	close(w.ch)
}

func (s *store[T]) watcherCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.watchers)
}
