package manifests

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
)

// Snapshot is a source's complete current view (the kubelet's SET semantics):
// a pod missing from it is to be stopped. Pods may be shared between
// snapshots and must be treated as read-only.
type Snapshot struct {
	Source string    // e.g. "file:/etc/pods"; identifies the source
	Pods   []*v1.Pod // identified, defaulted, validated pods
	Errors []error   // per-file/per-document problems, each a *ManifestError
	// Warnings name fields a pod sets that noderun ignores on purpose.
	Warnings []error
	// ConfigMaps and Secrets are the source's config objects (only with
	// --local-config-objects), identified by namespace/name; shared and
	// read-only as pods are. Secrets are kept in memory only.
	ConfigMaps []*v1.ConfigMap
	Secrets    []*v1.Secret
	Info       SourceInfo
	// Unavailable: the source has never read its manifests (a URL that has
	// not answered yet and has no saved response), so its pods are unknown,
	// not absent; running pods it may own must not be removed.
	Unavailable bool
}

// FileSource reads Pod manifests from a directory or a single file and emits
// a Snapshot whenever what they define changes.
type FileSource struct {
	path     string
	nodeName string
	source   string
	relist   time.Duration
	debounce time.Duration
	settle   time.Duration
	opts     parseOptions
	log      *slog.Logger
	// newWatcher makes the inotify watcher; tests make it fail.
	newWatcher func() (*fsnotify.Watcher, error)
}

// FileOption configures a FileSource.
type FileOption func(*FileSource)

// WithRelistInterval sets how often the source re-reads everything, as a
// safety net for missed events and for symlink targets changing elsewhere.
// The default is 20s.
func WithRelistInterval(d time.Duration) FileOption {
	return func(s *FileSource) { s.relist = d }
}

// pollInterval is how often the manifests are re-read while they cannot be
// watched: the host's inotify instances or watches are used up (they are
// shared by every process of the user), and changes would otherwise wait
// for the re-list.
const pollInterval = 2 * time.Second

// renameSettle is how long a manifest that was renamed away may take to
// come back before its pods are removed.
const renameSettle = time.Second

// WithWriteSettle sets how long a manifest written in place must go
// without a write before its content is applied; the default is 500ms. A
// writer that pauses mid-file (curl into the directory, a script writing
// line by line) can leave a valid prefix, a shorter PodList or a cut env
// list, that would replace the pods with truncated ones. A file renamed
// into place is complete and is read at once; at start, when no write was
// seen, a file modified within this time is waited for.
func WithWriteSettle(d time.Duration) FileOption {
	return func(s *FileSource) { s.settle = d }
}

// maxFirstWait bounds how long the first snapshot waits for files being
// written; after it they are read as they are.
const maxFirstWait = 5 * time.Second

// WithDebounce sets how long a path must stay quiet before it is re-read, so
// a writer's burst yields one update. The default is 10ms; a manifest moved
// away is taken as gone only after renameSettle.
func WithDebounce(d time.Duration) FileOption {
	return func(s *FileSource) { s.debounce = d }
}

// WithLocalConfigObjects reads ConfigMap and Secret documents and lets
// pods refer to them (--local-config-objects); without it both are errors,
// as API references in static pods are for the kubelet.
func WithLocalConfigObjects() FileOption {
	return func(s *FileSource) { s.opts.localConfig = true }
}

// WithLogger sets the logger; the default discards.
func WithLogger(l *slog.Logger) FileOption {
	return func(s *FileSource) { s.log = l }
}

// NewFileSource returns a source for path, a directory of manifests or a
// single manifest file, whose pods are to run on nodeName. In a directory only
// regular files (or symlinks to them) named *.yaml, *.yml or *.json count;
// subdirectories and editor or package-manager leftovers are ignored.
func NewFileSource(path, nodeName string, opts ...FileOption) *FileSource {
	// An absolute path keeps UIDs, which hash the source, independent of the
	// working directory.
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	s := &FileSource{path: filepath.Clean(path), nodeName: nodeName}
	for _, o := range opts {
		o(s)
	}
	// Defaults after options, so a zero value cannot stall the timers.
	if s.relist <= 0 {
		s.relist = 20 * time.Second
	}
	if s.debounce <= 0 {
		// Long enough for a writer's burst (cp, an editor's save), short
		// next to starting a pod: renaming a finished file in is the way
		// to publish a manifest, and it is seen this soon after.
		s.debounce = 10 * time.Millisecond
	}
	if s.settle <= 0 {
		s.settle = 500 * time.Millisecond
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.newWatcher == nil {
		// Buffered: fsnotify queues a whole read from the kernel at once,
		// so drain finds a burst's events waiting instead of taking them
		// one goroutine handover at a time, which a busy machine stretches
		// out.
		s.newWatcher = func() (*fsnotify.Watcher, error) { return fsnotify.NewBufferedWatcher(maxDrain) }
	}
	s.source = "file:" + s.path
	return s
}

// Run sends a Snapshot after the initial list, then one each time the
// manifests' pods or errors change, until ctx ends. It returns nil when ctx
// ends and an error only if its watcher fails. When it cannot watch, it
// says so and re-reads the manifests every pollInterval instead: the first
// snapshot must come regardless, or the engine never starts.
func (s *FileSource) Run(ctx context.Context, out chan<- Snapshot) error {
	w, err := s.newWatcher()
	if err != nil {
		s.log.Warn("cannot watch manifests; re-reading them every "+pollInterval.String(), "path", s.path, "err", err)
		w = nil
	} else {
		defer w.Close()
	}
	r := &fileRun{FileSource: s, w: w, files: map[string]*fileResult{}, pending: map[string]time.Time{},
		written: map[string]time.Time{}, starting: true}
	// Watch before listing, so no change between the two is missed.
	r.watch()
	r.relistAll()
	settled := r.awaitSettled(ctx)
	r.starting = false
	if !settled || !r.send(ctx, out, true) {
		return nil
	}
	return r.loop(ctx, out)
}

// fileRun is the state of one Run.
type fileRun struct {
	*FileSource
	w           *fsnotify.Watcher
	watched     string      // directory under watch, "" if none
	watchedInfo fs.FileInfo // to notice the directory being replaced
	files       map[string]*fileResult
	pending     map[string]time.Time // debounce deadline per path
	// readAsIs applies what is read without waiting for writes to settle:
	// for check, and when the first snapshot has waited long enough.
	readAsIs bool
	// written is when each path was last written in place (a write event;
	// a file renamed in has none), starting that the first snapshot is not
	// sent yet: the two ways a file may be half written.
	written  map[string]time.Time
	starting bool
	// sweeping: a re-list on the timer or after lost events is reading.
	// A change it finds may be a write whose events are not taken yet (a
	// busy machine), so a recently modified file waits as at start.
	sweeping bool
	listErr  string // the listing error last logged
	watchErr string // the watch error last logged
	emitter
}

func (r *fileRun) loop(ctx context.Context, out chan<- Snapshot) error {
	every := r.relistEvery()
	relist := time.NewTicker(every)
	defer relist.Stop()
	var events <-chan fsnotify.Event
	var errs <-chan error
	if r.w != nil {
		events, errs = r.w.Events, r.w.Errors
	}
	debounce := time.NewTimer(time.Hour)
	debounce.Stop()
	defer debounce.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-events:
			if !ok {
				return fmt.Errorf("watching %s: event stream closed", r.path)
			}
			r.event(ev, debounce)
			if err := r.drain(debounce); err != nil {
				return err
			}
			// Files complete when their event came (renamed in) are read
			// now, not a timer's turn later, and sent as one snapshot.
			if !r.expire(time.Now()) {
				continue
			}
		case err, ok := <-errs:
			if !ok {
				return fmt.Errorf("watching %s: error stream closed", r.path)
			}
			// Most likely a queue overflow: events were lost.
			r.log.Warn("watch error; re-listing", "path", r.path, "err", err)
			r.watch()
			r.sweep()
		case <-relist.C:
			r.watch()
			r.sweep()
		case now := <-debounce.C:
			r.expire(now)
		}
		if d := r.relistEvery(); d != every {
			every = d
			relist.Reset(every)
		}
		// Any read may have put off a file still being written.
		if next, ok := r.nextDeadline(); ok {
			debounce.Reset(time.Until(next))
		}
		if !r.send(ctx, out, false) {
			return nil
		}
	}
}

// event notes a change at a path that matters and (re)arms the debounce.
func (r *fileRun) event(ev fsnotify.Event, debounce *time.Timer) {
	if !r.relevant(ev.Name) {
		return
	}
	r.log.Debug("manifest event", "path", ev.Name, "op", ev.Op.String())
	switch {
	case ev.Has(fsnotify.Write):
		r.written[ev.Name] = time.Now()
	case ev.Has(fsnotify.Create | fsnotify.Remove | fsnotify.Rename):
		delete(r.written, ev.Name) // a new file there, renamed in whole; or none
	}
	if ev.Name == r.watched && ev.Has(fsnotify.Remove|fsnotify.Rename) {
		r.unwatch()
	}
	r.watch()
	// A change to the source path or above it may reveal or hide files
	// that produced no events of their own: list everything again.
	key := ev.Name
	if isAncestor(key, r.path) || configMapSwap(r.path, key) {
		key = r.path
	}
	wait := r.debounce
	if ev.Op == fsnotify.Create && key == ev.Name && !openForWriting(ev.Name) {
		// Complete: renamed in (the way to publish a manifest) or written
		// and closed already. No writer's burst is left to wait for.
		wait = 0
	}
	if ev.Has(fsnotify.Rename) && key == ev.Name {
		// Moved away: most often an editor saving (vim renames the file
		// to file~ before writing it anew). Give the new file time to
		// appear; its own events shorten the wait again.
		wait = max(wait, renameSettle)
	}
	r.pending[key] = time.Now().Add(wait)
	next, _ := r.nextDeadline()
	debounce.Reset(time.Until(next))
}

// maxDrain bounds the events taken in one turn, so that a directory
// written to without pause still gets its snapshots sent.
const maxDrain = 1024

// drain takes the events already queued behind one, so that a burst of
// manifests (many files renamed in at once) is read and sent as one
// snapshot: not one per file, each assembled from every file and applied
// to every pod. fsnotify hands events over one at a time, so an empty
// channel gets one yield for its reader to queue the next.
func (r *fileRun) drain(debounce *time.Timer) error {
	yielded := false
	for range maxDrain {
		select {
		case ev, ok := <-r.w.Events:
			if !ok {
				return fmt.Errorf("watching %s: event stream closed", r.path)
			}
			r.event(ev, debounce)
			yielded = false
		default:
			if yielded {
				return nil
			}
			runtime.Gosched()
			yielded = true
		}
	}
	return nil
}

// openForWriting reports whether any process has the file at path open for
// writing, or whether that cannot be told: a read lease is refused
// (EAGAIN) while the file has a writer. Leases need the file's owner or
// CAP_LEASE and a local filesystem; elsewhere a writer is assumed.
func openForWriting(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return true
	}
	defer f.Close()
	if _, err := unix.FcntlInt(f.Fd(), unix.F_SETLEASE, unix.F_RDLCK); err != nil {
		return true
	}
	unix.FcntlInt(f.Fd(), unix.F_SETLEASE, unix.F_UNLCK)
	return false
}

// relevant reports whether a change at name can change the snapshot: the
// source path itself, a directory on the way to it, or a manifest in it.
func (r *fileRun) relevant(name string) bool {
	if name == r.path || isAncestor(name, r.path) || configMapSwap(r.path, name) {
		return true
	}
	return filepath.Dir(name) == r.path && manifestName(filepath.Base(name))
}

// configMapSwap reports a change to a "..name" entry of the directory: the
// way Kubernetes' atomic writer (ConfigMap and Secret volumes) publishes new
// files, by swapping the ..data symlink that the visible files point
// through. Such a change is invisible on the files themselves.
func configMapSwap(dir, name string) bool {
	return filepath.Dir(name) == dir && strings.HasPrefix(filepath.Base(name), "..")
}

func isAncestor(dir, path string) bool {
	return dir == "/" || strings.HasPrefix(path, dir+string(filepath.Separator))
}

// manifestName accepts *.yaml, *.yml and *.json but not dot-files (editor
// swap files, atomic-writer staging). Other editor and package-manager
// leftovers (*.swp, *~, 4913, *.bak, *.orig, *.tmp) fail the extension test.
func manifestName(name string) bool {
	if strings.HasPrefix(name, ".") || strings.Contains(name, ".dpkg-") {
		return false
	}
	switch strings.ToLower(filepath.Ext(name)) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}

// expire re-reads every path whose debounce deadline has passed, and
// reports whether there was any.
func (r *fileRun) expire(now time.Time) bool {
	read := false
	for p, deadline := range r.pending {
		if deadline.After(now) {
			continue
		}
		delete(r.pending, p)
		read = true
		if p == r.path {
			r.relistAll()
		} else {
			r.load(p)
		}
	}
	return read
}

// awaitSettled holds the first snapshot until files being written are read
// whole (up to maxFirstWait): before it, running pods that no snapshot
// names are removed, and the pods of a file left out would be. It reports
// false if ctx ended.
func (r *fileRun) awaitSettled(ctx context.Context) bool {
	limit := time.Now().Add(maxFirstWait)
	for {
		next, ok := r.nextDeadline()
		if !ok {
			return true
		}
		if now := time.Now(); now.After(limit) {
			r.readAsIs = true // still being written: read as it is
			r.expire(now.Add(r.settle + r.debounce))
			r.readAsIs = false
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(time.Until(next)):
		}
		r.expire(time.Now())
	}
}

func (r *fileRun) nextDeadline() (time.Time, bool) {
	var next time.Time
	for _, d := range r.pending {
		if next.IsZero() || d.Before(next) {
			next = d
		}
	}
	return next, !next.IsZero()
}

// watch keeps a watch on the directory that holds the manifests: the source
// directory, a single file's parent, or, while the path does not exist, its
// nearest existing ancestor, so that its creation is noticed. It repeats
// until the target is stable, since a directory created before its parent's
// watch was in place produced no event.
func (r *fileRun) watch() {
	if r.w == nil {
		return
	}
	for range 16 {
		want, fi, err := r.watchTarget()
		if err != nil {
			r.watchFailed(r.path, err)
			return
		}
		if want == r.watched && os.SameFile(fi, r.watchedInfo) {
			return
		}
		r.unwatch()
		if err := r.w.Add(want); err != nil {
			r.watchFailed(want, err)
			return
		}
		r.log.Debug("watching", "dir", want, "for", r.path)
		r.watched, r.watchedInfo = want, fi
		r.watchErr = ""
	}
}

// watchFailed logs a watch that could not be set, once per new problem:
// it is tried again at each re-read.
func (r *fileRun) watchFailed(path string, err error) {
	if msg := err.Error(); msg != r.watchErr {
		r.log.Warn("cannot watch manifests; re-reading them every "+pollInterval.String(), "path", path, "err", err)
		r.watchErr = msg
	}
}

// polling reports whether the manifests are not watched, for want of an
// inotify instance or watch, and so must be re-read to see changes.
func (r *fileRun) polling() bool {
	return r.w == nil || r.watched == ""
}

func (r *fileRun) relistEvery() time.Duration {
	if r.polling() {
		return min(r.relist, pollInterval)
	}
	return r.relist
}

func (r *fileRun) watchTarget() (string, fs.FileInfo, error) {
	want := r.path
	fi, err := os.Stat(want)
	if err == nil && !fi.IsDir() {
		want = filepath.Dir(want)
		fi, err = os.Stat(want)
	}
	for err != nil && filepath.Dir(want) != want {
		want = filepath.Dir(want)
		fi, err = os.Stat(want)
	}
	return want, fi, err
}

func (r *fileRun) unwatch() {
	if r.w != nil && r.watched != "" {
		// The kernel drops the watch of a deleted directory itself.
		_ = r.w.Remove(r.watched)
		r.watched, r.watchedInfo = "", nil
	}
}

// sweep re-reads every manifest as a re-list not prompted by an event.
func (r *fileRun) sweep() {
	r.sweeping = true
	r.relistAll()
	r.sweeping = false
}

// relistAll re-reads every manifest. A missing path means no pods, as in the
// kubelet; an unreadable directory keeps the last state rather than stopping
// every pod over what may be a passing problem.
func (r *fileRun) relistAll() {
	paths, err := r.manifestPaths()
	if err != nil {
		if msg := err.Error(); msg != r.listErr { // once per new problem, not per re-list
			r.log.Error("cannot list manifests", "path", r.path, "err", err)
			r.listErr = msg
		}
		return
	}
	r.listErr = ""
	for p := range r.files {
		if !slices.Contains(paths, p) {
			delete(r.files, p)
		}
	}
	for _, p := range paths {
		r.load(p)
	}
}

func (r *fileRun) manifestPaths() ([]string, error) {
	fi, err := os.Stat(r.path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return []string{r.path}, nil
	}
	entries, err := os.ReadDir(r.path)
	if err != nil {
		return nil, err
	}
	var paths []string
	for _, e := range entries {
		if !e.IsDir() && manifestName(e.Name()) {
			paths = append(paths, filepath.Join(r.path, e.Name()))
		}
	}
	return paths, nil
}

// load re-reads one manifest file into r.files. Only a removed file or
// valid content replaces the pods a file had (see keepLastGood).
func (r *fileRun) load(path string) {
	data, fi, exists, err := readManifest(path)
	switch prev := r.files[path]; {
	case !exists:
		delete(r.files, path)
	case err != nil:
		r.files[path] = readFailed(prev, &ManifestError{File: path, Err: err})
	case prev != nil && prev.readOK && bytes.Equal(prev.data, data):
		// Unchanged: keep the pods as they are, config.seen included.
	case prev != nil && len(data) == 0:
		// Truncated by a writer that has not written yet (O_TRUNC, then
		// write): an empty file removes nothing; deleting the file does.
	case !r.settled(path, fi):
		// Still being written: what the file had stands until it settles.
	default:
		r.files[path] = keepLastGood(prev, parseManifest(data, path, r.nodeName, r.source, time.Now(), r.opts))
	}
}

// settled reports whether the file, read as it was at fi, is done being
// written: its size and mtime did not change during the read, and it was
// not written in place within r.settle (at start or in a sweep, when a
// write may not have been seen: not modified within it). Otherwise it puts off another read.
func (r *fileRun) settled(path string, fi fs.FileInfo) bool {
	if r.readAsIs {
		return true
	}
	after, err := os.Stat(path)
	if err != nil {
		return true // gone or unreadable: the event or re-list that follows tells
	}
	var wait time.Duration
	wrote, writing := r.written[path]
	age := time.Since(after.ModTime())
	switch {
	case after.Size() != fi.Size() || !after.ModTime().Equal(fi.ModTime()):
		wait = r.debounce
	case writing && time.Since(wrote) < r.settle:
		wait = r.settle - time.Since(wrote)
	case (r.starting || r.sweeping || r.polling()) && age >= 0 && age < r.settle:
		// A future mtime (another host's clock, over NFS) says nothing
		// of a local writer; the size check above still applies.
		wait = r.settle - age
	default:
		delete(r.written, path)
		return true
	}
	r.log.Debug("manifest being written; reading it again later", "path", path, "in", wait)
	r.pending[path] = time.Now().Add(wait)
	return false
}

// readManifest reads path if it is a regular file or a symlink to one, and
// returns what Stat said before the read; exists is false when there is no
// such file to read.
func readManifest(path string) (data []byte, fi fs.FileInfo, exists bool, err error) {
	fi, err = os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, false, nil
	}
	if err != nil {
		return nil, nil, true, err
	}
	if !fi.Mode().IsRegular() {
		return nil, nil, false, nil
	}
	if fi.Size() > MaxFileSize {
		return nil, nil, true, ErrTooLarge
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, !errors.Is(err, fs.ErrNotExist), err
	}
	defer f.Close()
	// The size may have grown since Stat.
	data, err = io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err == nil && len(data) > MaxFileSize {
		err = ErrTooLarge
	}
	return data, fi, true, err
}

func (r *fileRun) send(ctx context.Context, out chan<- Snapshot, force bool) bool {
	snap, fingerprint := r.snapshot()
	return r.emit(ctx, out, snap, fingerprint, force, r.log)
}

// snapshot assembles the files' pods in path order (see assemble).
func (r *fileRun) snapshot() (Snapshot, string) {
	order := slices.Sorted(maps.Keys(r.files))
	snap, fp := assemble(r.source, order, r.files)
	snap.Info.Kind, snap.Info.Path = KindFile, r.path
	for _, path := range order {
		snap.Info.Files = append(snap.Info.Files, FileInfo{Path: path, ReadAt: r.files[path].readAt})
	}
	return snap, fp
}
