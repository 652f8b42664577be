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
	"slices"
	"strings"
	"time"
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
}

// pollEvery is how often a follow that cannot watch looks for output.
const pollEvery = time.Second

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
// following, which waits for it.
func ReadLog(ctx context.Context, path string, w io.Writer, opts ReadOptions) error {
	lr := &logReader{opts: opts, out: w, errOut: opts.Stderr, pending: map[string]*joined{}}
	if opts.LimitBytes > 0 {
		lr.out = &limitWriter{w: w, left: opts.LimitBytes}
	}
	if lr.errOut == nil {
		lr.errOut = lr.out
	}
	if opts.TailLines >= 0 {
		lr.tail = &ring{max: opts.TailLines}
	}
	var sub *dirSub
	if opts.Follow {
		// Watch before reading, so a write between the last read and the
		// wait is not missed.
		var err error
		if sub, err = follows.subscribe(path); err != nil {
			if opts.Polling == nil {
				return err
			}
			opts.Polling(err)
		} else {
			defer follows.unsubscribe(sub)
		}
	}
	var err error
	if opts.TailLines != 0 {
		err = lr.readRotated(path)
	}
	if err == nil {
		var live *os.File
		live, err = lr.readLive(path)
		if err == nil && opts.Follow {
			err = lr.follow(ctx, path, live, sub)
		}
		if live != nil {
			live.Close()
		}
	}
	if errors.Is(err, errLimit) {
		return nil
	}
	return err
}

// rotatedFiles lists path's rotated files, oldest first.
func rotatedFiles(path string) []string {
	matches, _ := filepath.Glob(globEscape(path) + ".*")
	var out []string
	for _, p := range matches {
		if !strings.HasSuffix(p, ".tmp") {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b string) int {
		return strings.Compare(strings.TrimSuffix(a, ".gz"), strings.TrimSuffix(b, ".gz"))
	})
	return out
}

// globEscape quotes glob metacharacters a pod or container name may hold.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

func (lr *logReader) readRotated(path string) error {
	for _, p := range rotatedFiles(path) {
		f, err := os.Open(p)
		if errors.Is(err, fs.ErrNotExist) && !strings.HasSuffix(p, ".gz") {
			p += ".gz" // compressed since it was listed
			f, err = os.Open(p)
		}
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed as too old since it was listed
		} else if err != nil {
			return fmt.Errorf("crilog: read %s: %w", p, err)
		}
		err = lr.readFile(p, f)
		f.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

func (lr *logReader) readFile(p string, f *os.File) error {
	var r io.Reader = f
	if strings.HasSuffix(p, ".gz") {
		zr, err := gzip.NewReader(f)
		if err != nil {
			return fmt.Errorf("crilog: read %s: %w", p, err)
		}
		defer zr.Close()
		r = zr
	}
	if err := lr.readAll(bufio.NewReader(r)); err != nil && !errors.Is(err, errLimit) {
		return fmt.Errorf("crilog: read %s: %w", p, err)
	} else if err != nil {
		return err
	}
	lr.frag = lr.frag[:0] // a record cut by a crash ends with its file
	return lr.flush()
}

// readLive reads the current log to its end and writes out the tail; the
// file is returned open for follow (nil when it does not exist yet).
func (lr *logReader) readLive(path string) (*os.File, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, lr.endTail()
	} else if err != nil {
		return nil, fmt.Errorf("crilog: read %s: %w", path, err)
	}
	if lr.opts.TailLines == 0 {
		// Nothing of what is there goes out: start at its end. A record
		// cut there is not one and is skipped.
		_, err = f.Seek(0, io.SeekEnd)
	}
	lr.br = bufio.NewReader(f)
	if err == nil {
		err = lr.readAll(lr.br)
	}
	if err == nil && !lr.opts.Follow {
		err = lr.flush() // an unterminated last line, as the container left it
	}
	if err == nil {
		err = lr.endTail()
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
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
		if created && !isOpen(f, path) {
			// Rotated: what the old file still held, then the new one.
			// (A Create of the file already open is its creation, seen
			// after it was opened: not a rotation.)
			if err := lr.drain(f); err != nil {
				return err
			}
			lr.frag = lr.frag[:0]
			nf, err := os.Open(path)
			if errors.Is(err, fs.ErrNotExist) {
				continue // renamed again already; its Create follows
			} else if err != nil {
				return fmt.Errorf("crilog: follow %s: %w", path, err)
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

// isOpen reports whether f is the file at path.
func isOpen(f *os.File, path string) bool {
	if f == nil {
		return false
	}
	open, err := f.Stat()
	if err != nil {
		return false
	}
	now, err := os.Stat(path)
	return err == nil && os.SameFile(open, now)
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
	tail    *ring              // lines held back for TailLines; nil once live
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
	var b []byte
	if lr.opts.Timestamps {
		b = t.AppendFormat(b, time.RFC3339Nano)
		b = append(b, ' ')
	}
	b = append(append(b, content...), '\n')
	if lr.tail != nil {
		lr.tail.add(outLine{stream, b})
		return nil
	}
	return lr.write(outLine{stream, b})
}

// outLine is a line ready to go out, and the stream it came from.
type outLine struct {
	stream string
	b      []byte
}

func (lr *logReader) write(l outLine) error {
	w := lr.out
	if l.stream == Stderr {
		w = lr.errOut
	}
	_, err := w.Write(l.b)
	return err
}

// endTail writes the held-back last lines; from now on lines go out as
// they come.
func (lr *logReader) endTail() error {
	t := lr.tail
	if t == nil {
		return nil
	}
	lr.tail = nil
	for _, l := range t.lines() {
		if err := lr.write(l); err != nil {
			return err
		}
	}
	return nil
}

// ring keeps the last max lines added.
type ring struct {
	max   int
	buf   []outLine
	start int
}

func (r *ring) add(b outLine) {
	if r.max == 0 {
		return
	}
	if len(r.buf) < r.max {
		r.buf = append(r.buf, b)
		return
	}
	r.buf[r.start] = b
	r.start = (r.start + 1) % r.max
}

func (r *ring) lines() []outLine {
	return append(r.buf[r.start:], r.buf[:r.start]...)
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
