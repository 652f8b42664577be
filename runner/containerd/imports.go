package containerd

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"

	ctrd "github.com/containerd/containerd"
)

// ImportLedger remembers which image tarballs were imported, by size and
// modification time, so a start reads only the tarballs that changed (an
// appliance's images dir can hold gigabytes). A nil ledger remembers
// nothing.
type ImportLedger struct {
	path string
	mu   sync.Mutex
	seen map[string]ledgerEntry // by tarball path
	busy int                    // start-up imports under way
}

type ledgerEntry struct {
	Size    int64    `json:"size"`
	ModTime int64    `json:"mtime_ns"`
	Names   []string `json:"names"`
}

// OpenImportLedger reads the ledger at path; a missing or unreadable one
// starts empty (everything is imported once more).
func OpenImportLedger(path string) *ImportLedger {
	l := &ImportLedger{path: path, seen: map[string]ledgerEntry{}}
	if b, err := os.ReadFile(path); err == nil {
		_ = json.Unmarshal(b, &l.seen)
	}
	return l
}

// unchanged returns the images a tarball yielded when it was imported, if
// it has not changed since and they are all still in containerd.
func (l *ImportLedger) unchanged(ctx context.Context, c *ctrd.Client, path string, fi os.FileInfo) ([]string, bool) {
	if l == nil {
		return nil, false
	}
	l.mu.Lock()
	e, ok := l.seen[path]
	l.mu.Unlock()
	if !ok || e.Size != fi.Size() || e.ModTime != fi.ModTime().UnixNano() || len(e.Names) == 0 {
		return nil, false
	}
	for _, name := range e.Names {
		if _, err := c.GetImage(ctx, name); err != nil {
			return nil, false // removed meanwhile: import again
		}
	}
	return e.Names, true
}

// record notes an import and saves the ledger (write to a temporary
// file, then rename, so a crash leaves the old ledger or the new).
func (l *ImportLedger) record(path string, fi os.FileInfo, names []string) error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seen[path] = ledgerEntry{Size: fi.Size(), ModTime: fi.ModTime().UnixNano(), Names: names}
	b, err := json.Marshal(l.seen)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(l.path), 0o700); err != nil {
		return err
	}
	tmp := l.path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, l.path)
}

// present lists the images of tarballs still in place: they are not
// garbage, since the next start would import them again.
func (l *ImportLedger) present() []string {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for path, e := range l.seen {
		if _, err := os.Stat(path); err == nil {
			out = append(out, e.Names...)
		}
	}
	return out
}

// startImports marks the start-up imports under way; call the returned
// func when they are done.
func (l *ImportLedger) startImports() (done func()) {
	if l == nil {
		return func() {}
	}
	l.mu.Lock()
	l.busy++
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		l.busy--
		l.mu.Unlock()
	}
}

// importing reports whether start-up imports are under way.
func (l *ImportLedger) importing() bool {
	if l == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.busy > 0
}
