package crilog

import (
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// ReadOptions are what `kubectl logs` asks of a container's log.
type ReadOptions struct {
	// Follow keeps writing what the container adds until Ended is closed
	// and the log is read to its end, or ctx ends.
	Follow bool
	// Since skips lines written before it; zero keeps all.
	Since time.Time
	// TailLines keeps only the last lines of what is there; negative keeps
	// all. Lines written later while following all go out.
	TailLines int
	// LimitBytes stops after that many bytes of output; zero or negative
	// has no limit.
	LimitBytes int64
	// Timestamps starts each line with its RFC 3339 time.
	Timestamps bool
	// Ended is closed once the container has ended; a follow then reads
	// what the log driver still writes and returns. Nil: until ctx ends.
	Ended <-chan struct{}
	// Stderr, when set, gets the lines the container wrote to its stderr
	// (kubectl attach keeps the two apart); otherwise they go to w.
	Stderr io.Writer
	// Polling, when set, is told why a follow cannot watch the log's
	// directory (no inotify instance or watch left on the host); the
	// follow then looks for new output every pollEvery. Nil: the follow
	// fails instead.
	Polling func(error)
	// Root is the pod log dir: no link below it is followed, since pods
	// with a hostPath there can plant them. "": the log's own directory.
	Root string
}

// pollEvery is how often a follow that cannot watch looks for output.
const pollEvery = time.Second

// outOfInotify reports an error that says the host has no inotify instance
// or watch left for this user (or no memory for one).
func outOfInotify(err error) bool {
	return errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) || errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.ENOMEM)
}

// endSettle is how long a follow goes on reading after the container
// ended: the log driver may still be writing the container's last output
// from its pipes when the end is known.
const endSettle = 500 * time.Millisecond

// maxJoined bounds a line joined from partial records: a line that never
// ends must not take all memory; what is held past it goes out as a line.
const maxJoined = 1 << 20

// errLimit ends a read at LimitBytes.
var errLimit = errors.New("crilog: byte limit reached")

// ReadLog writes the container log at path to w as `kubectl logs` shows it:
// the content of its records, stdout and stderr in the order written,
// partial records joined into their line, beginning with the rotated files
// (<path>.<time>, gzipped or not) that are still kept. Lines that are not
// CRI records are skipped, as the kubelet skips them. A log that does not
// exist yet reads as empty (the container has not written), unless
// following, which waits for it. Links below opts.Root are not followed.
func ReadLog(ctx context.Context, path string, w io.Writer, opts ReadOptions) error {
	lr := &logReader{opts: opts, out: w, errOut: opts.Stderr, pending: map[string]*joined{},
		root: logRoot(opts.Root, path), name: filepath.Base(path)}
	if opts.LimitBytes > 0 {
		lr.out = &limitWriter{w: w, left: opts.LimitBytes}
	}
	if lr.errOut == nil {
		lr.errOut = lr.out
	}
	var sub *dirSub
	if opts.Follow {
		// Watch before reading, so a write between the last read and the
		// wait is not missed.
		var err error
		if sub, err = follows.subscribe(path); err != nil {
			if opts.Polling == nil || !outOfInotify(err) {
				return err
			}
			opts.Polling(err)
		} else {
			defer follows.unsubscribe(sub)
		}
	}
	if err := lr.openDir(path); err != nil {
		return err
	}
	defer func() {
		if lr.dir != nil {
			lr.dir.Close()
		}
	}()
	live, err := lr.read(path)
	if err == nil && opts.Follow {
		err = lr.follow(ctx, path, live, sub)
	} else if live != nil {
		live.Close()
	}
	if errors.Is(err, errLimit) {
		return nil
	}
	return err
}

// read writes what the log holds as asked and returns the live file open
// for follow (nil when it does not exist yet).
func (lr *logReader) read(path string) (*os.File, error) {
	if lr.opts.TailLines > 0 {
		return lr.readTail(path)
	}
	// The live file first: rotated meanwhile, it is still read, and only
	// once (openRotated leaves it out).
	live, err := lr.openLive()
	if err != nil {
		return nil, err
	}
	if lr.opts.TailLines < 0 {
		for _, p := range lr.rotated() {
			f, p, err := lr.openRotated(p, live)
			if err == nil && f != nil {
				err = lr.readFile(p, f)
				f.Close()
			}
			if err != nil {
				if live != nil {
					live.Close()
				}
				return nil, err
			}
		}
	}
	if live == nil {
		return nil, nil
	}
	if lr.opts.TailLines == 0 {
		// Nothing of what is there goes out: start at its end. A record
		// cut there is not one and is skipped.
		if _, err := live.Seek(0, io.SeekEnd); err != nil {
			live.Close()
			return nil, fmt.Errorf("crilog: read %s: %w", path, err)
		}
	}
	if err := lr.readLive(live, -1); err != nil {
		live.Close()
		return nil, err
	}
	return live, nil
}

// readTail writes the last TailLines lines. It counts the lines of the
// live file, then of the rotated files from the newest back until there
// are enough, and reads those files again, skipping the lines before the
// tail: memory stays bounded however many lines are asked for (a ring of
// lines would hold the whole log), and files older than the tail are not
// read at all. The files stay open between the two passes, so a rotation
// meanwhile changes nothing; the live file is taken as it was at the
// count, and what it gets later goes out only when following.
func (lr *logReader) readTail(path string) (*os.File, error) {
	live, err := lr.openLive()
	if err != nil {
		return nil, err
	}
	var end int64
	if live != nil {
		fi, err := live.Stat()
		if err != nil {
			live.Close()
			return nil, fmt.Errorf("crilog: read %s: %w", path, err)
		}
		end = fi.Size()
	}
	type rotated struct {
		f *os.File
		p string
	}
	var older []rotated // newest first
	defer func() {
		for _, r := range older {
			r.f.Close()
		}
	}()
	need := lr.opts.TailLines
	skip := 0 // lines before the tail in the oldest file read
	n, err := lr.count(func() error { return lr.readLive(live, end) })
	if n >= need {
		skip = n - need
	} else if err == nil {
		need -= n
		names := lr.rotated()
		for i := len(names) - 1; i >= 0 && err == nil; i-- {
			var f *os.File
			p := names[i]
			if f, p, err = lr.openRotated(p, live); err != nil || f == nil {
				continue
			}
			older = append(older, rotated{f, p})
			if n, err = lr.count(func() error { return lr.readFile(p, f) }); n >= need {
				skip = n - need
				break
			}
			need -= n
		}
	}
	if err != nil {
		if live != nil {
			live.Close()
		}
		return nil, err
	}
	lr.skip = skip
	for i := len(older) - 1; i >= 0 && err == nil; i-- {
		if _, err = older[i].f.Seek(0, io.SeekStart); err == nil {
			err = lr.readFile(older[i].p, older[i].f)
		}
	}
	if err == nil && live != nil {
		if _, err = live.Seek(0, io.SeekStart); err == nil {
			limit := end
			if lr.opts.Follow {
				limit = -1 // the rest goes out as written later
			}
			err = lr.readLive(live, limit)
		}
	}
	if err != nil && live != nil {
		live.Close()
		return nil, err
	}
	return live, err
}

// count runs read counting the lines it would write, and forgets what it
// left partial.
func (lr *logReader) count(read func() error) (int, error) {
	lr.counting, lr.counted = true, 0
	err := read()
	lr.counting = false
	lr.frag = lr.frag[:0]
	clear(lr.pending)
	return lr.counted, err
}

// openDir opens the log's directory, following no link below the root;
// lr.dir stays nil while it does not exist.
func (lr *logReader) openDir(path string) error {
	d, err := openDirBelow(lr.root, filepath.Dir(path), false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("crilog: read %s: %w", path, err)
	}
	lr.dir = d
	return nil
}

// rotated lists the log's rotated files, oldest first.
func (lr *logReader) rotated() []string {
	if lr.dir == nil {
		return nil
	}
	return rotatedNames(lr.dir, lr.name)
}

// openRotated opens the rotated file listed as p; nil when it is gone
// since (removed as too old) or is live, the live file rotated since it
// was opened. p changes when it was compressed since.
func (lr *logReader) openRotated(p string, live *os.File) (*os.File, string, error) {
	f, err := openIn(lr.dir, p, unix.O_RDONLY, 0)
	if errors.Is(err, fs.ErrNotExist) && !strings.HasSuffix(p, ".gz") {
		p += ".gz" // compressed since it was listed
		f, err = openIn(lr.dir, p, unix.O_RDONLY, 0)
	}
	if errors.Is(err, fs.ErrNotExist) {
		return nil, p, nil
	} else if err != nil {
		return nil, p, fmt.Errorf("crilog: read: %w", err)
	}
	if live != nil {
		a, aerr := f.Stat()
		b, berr := live.Stat()
		if aerr == nil && berr == nil && os.SameFile(a, b) {
			f.Close()
			return nil, p, nil
		}
	}
	return f, p, nil
}

// openLive opens the current log; nil when it does not exist yet.
func (lr *logReader) openLive() (*os.File, error) {
	if lr.dir == nil {
		return nil, nil
	}
	f, err := openIn(lr.dir, lr.name, unix.O_RDONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("crilog: read: %w", err)
	}
	return f, nil
}

func (lr *logReader) readFile(p string, f *os.File) error {
	var r io.Reader = f
	if strings.HasSuffix(p, ".gz") {
		zr, err := gzip.NewReader(f)
		if err != nil {
			return fmt.Errorf("crilog: read %s: %w", f.Name(), err)
		}
		defer zr.Close()
		r = zr
	}
	if err := lr.readAll(bufio.NewReader(r)); err != nil && !errors.Is(err, errLimit) {
		return fmt.Errorf("crilog: read %s: %w", f.Name(), err)
	} else if err != nil {
		return err
	}
	lr.frag = lr.frag[:0] // a record cut by a crash ends with its file
	return lr.flush()
}

// readLive reads the current log from where f is, up to its end or to
// offset limit (negative: no limit); follow goes on from there.
func (lr *logReader) readLive(f *os.File, limit int64) error {
	if f == nil {
		return nil
	}
	if limit >= 0 {
		lr.br = bufio.NewReader(io.NewSectionReader(f, 0, limit))
	} else {
		lr.br = bufio.NewReader(f)
	}
	err := lr.readAll(lr.br)
	if err == nil && !lr.opts.Follow {
		err = lr.flush() // an unterminated last line, as the container left it
	}
	return err
}

// follow writes what is appended to the log, moving to the new file when
// the log is rotated, until the container has ended and all is read.
func (lr *logReader) follow(ctx context.Context, path string, f *os.File, sub *dirSub) error {
	defer func() { // f changes when the log rotates
		if f != nil {
			f.Close()
		}
	}()
	var wake <-chan struct{}
	var poll <-chan time.Time
	if sub != nil {
		wake = sub.wake
	} else {
		t := time.NewTicker(pollEvery)
		defer t.Stop()
		poll = t.C
	}
	ended := lr.opts.Ended
	var settled <-chan time.Time
	for {
		created := true // a poll cannot tell: look whether it rotated
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
			created = follows.takeCreated(sub)
		case <-poll:
		case <-ended:
			ended = nil
			settled = time.After(endSettle)
			continue
		case <-settled:
			// Read once more: the last writes may have come after the
			// last event was handled.
			if err := lr.drain(f); err != nil {
				return err
			}
			return lr.flush()
		}
		if created && lr.dir == nil {
			// Made since the read began: a follow that polls gets here.
			if err := lr.openDir(path); err != nil {
				return err
			}
		}
		if created && !lr.isOpen(f) {
			// Rotated: what the old file still held, then the new one.
			// (A Create of the file already open is its creation, seen
			// after it was opened: not a rotation.)
			if err := lr.drain(f); err != nil {
				return err
			}
			lr.frag = lr.frag[:0]
			nf, err := lr.openLive()
			if err != nil {
				return fmt.Errorf("crilog: follow %s: %w", path, err)
			} else if nf == nil {
				continue // renamed again already; its Create follows
			}
			if f != nil {
				f.Close()
			}
			f, lr.br = nf, bufio.NewReader(nf)
		}
		if err := lr.drain(f); err != nil {
			return err
		}
	}
}

// isOpen reports whether f is the file named as the log.
func (lr *logReader) isOpen(f *os.File) bool {
	if f == nil || lr.dir == nil {
		return false
	}
	var open, now unix.Stat_t
	if unix.Fstat(int(f.Fd()), &open) != nil {
		return false
	}
	err := unix.Fstatat(int(lr.dir.Fd()), lr.name, &now, unix.AT_SYMLINK_NOFOLLOW)
	return err == nil && open.Dev == now.Dev && open.Ino == now.Ino
}

func (lr *logReader) drain(f *os.File) error {
	if f == nil {
		return nil
	}
	return lr.readAll(lr.br)
}

// logReader turns records into output lines.
type logReader struct {
	opts    ReadOptions
	out     io.Writer
	errOut  io.Writer          // out unless Stderr is set
	br      *bufio.Reader      // the live file's reader
	frag    []byte             // a record the live file holds only part of yet
	pending map[string]*joined // per stream: partial records not yet ended
	root    string             // no link below it is followed
	dir     *os.File           // the log's directory; nil while it does not exist
	name    string             // the log's name in dir
	// counting counts the lines in counted instead of writing them; skip
	// is how many lines are left to drop before the tail.
	counting bool
	counted  int
	skip     int
}

// joined is a line built from partial records; it takes the time of its
// first part.
type joined struct {
	t       time.Time
	content []byte
}

// readAll handles every whole record r holds; an unterminated last record
// (the writer is mid-write) is kept until the rest arrives.
func (lr *logReader) readAll(r *bufio.Reader) error {
	for {
		b, err := r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) || (err == io.EOF && len(b) > 0) {
			lr.frag = append(lr.frag, b...)
			if err == io.EOF {
				return nil
			}
			continue
		}
		if err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
		line := b
		if len(lr.frag) > 0 {
			line = append(lr.frag, b...)
			lr.frag = lr.frag[:0]
		}
		if err := lr.record(line); err != nil {
			return err
		}
	}
}

func (lr *logReader) record(line []byte) error {
	t, stream, partial, content, err := ParseLine(string(line))
	if err != nil {
		return nil // not a record: skipped, as the kubelet's ReadLogs does
	}
	j := lr.pending[stream]
	if j == nil {
		if partial {
			lr.pending[stream] = &joined{t: t, content: []byte(content)}
			return nil
		}
		return lr.line(stream, t, content)
	}
	j.content = append(j.content, content...)
	if partial && len(j.content) < maxJoined {
		return nil
	}
	delete(lr.pending, stream)
	return lr.line(stream, j.t, string(j.content))
}

// flush ends the lines a file left partial: a rotated file's last record
// may be a container's unterminated last output.
func (lr *logReader) flush() error {
	for _, s := range []string{Stdout, Stderr} {
		if j := lr.pending[s]; j != nil {
			delete(lr.pending, s)
			if err := lr.line(s, j.t, string(j.content)); err != nil {
				return err
			}
		}
	}
	return nil
}

func (lr *logReader) line(stream string, t time.Time, content string) error {
	if !lr.opts.Since.IsZero() && t.Before(lr.opts.Since) {
		return nil
	}
	if lr.counting {
		lr.counted++
		return nil
	}
	if lr.skip > 0 {
		lr.skip--
		return nil
	}
	var b []byte
	if lr.opts.Timestamps {
		b = t.AppendFormat(b, time.RFC3339Nano)
		b = append(b, ' ')
	}
	b = append(append(b, content...), '\n')
	w := lr.out
	if stream == Stderr {
		w = lr.errOut
	}
	_, err := w.Write(b)
	return err
}

// limitWriter writes up to left bytes, cutting the write that reaches it,
// then fails with errLimit.
type limitWriter struct {
	w    io.Writer
	left int64
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if l.left <= 0 {
		return 0, errLimit
	}
	cut := p
	if int64(len(cut)) > l.left {
		cut = cut[:l.left]
	}
	n, err := l.w.Write(cut)
	l.left -= int64(n)
	if err == nil && len(cut) < len(p) {
		err = errLimit
	}
	return n, err
}
