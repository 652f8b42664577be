// Package crilog is a containerd binary log driver that writes container
// output in the CRI log format, so that kubectl-style tooling and the kubelet's
// parser can read noderun's container logs.
//
// containerd's shim starts the driver named by a binary:// log URI with the
// container's stdout on fd 3, its stderr on fd 4 and a pipe on fd 5 that the
// driver closes once it is ready to receive output.
package crilog

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Stream names and tags as defined by the CRI log format.
const (
	Stdout = "stdout"
	Stderr = "stderr"

	tagFull    = "F"
	tagPartial = "P"
)

// MaxLineLen is the longest record content; longer lines are split into
// partial records. It matches containerd CRI's max_container_log_line_size.
const MaxLineLen = 16 * 1024

// ErrBadLine is returned by ParseLine for text that is not a CRI log record.
var ErrBadLine = errors.New("crilog: malformed log line")

// URI returns the log URI that makes containerd's shim run
// `exe log-driver <t.Arg()>`. It has exactly one query key because the
// shim builds the argument list by iterating over a map.
func URI(exe string, t Target) string {
	u := url.URL{
		Scheme:   "binary",
		Path:     exe,
		RawQuery: url.Values{"log-driver": {t.Arg()}}.Encode(),
	}
	return u.String()
}

// CheckReply is what a driver program prints when run as `<driver> check`:
// noderun runs the driver it installs so, before containerd's shim does.
const CheckReply = "noderun log driver\n"

// handoffWait is how long a driver tries to reach the collector: noderun
// restarts a dead one within a second or so.
const handoffWait = 10 * time.Second

// ServeFDs runs the log driver on the descriptors containerd's shim passes
// to a binary log driver: fd 3 stdout, fd 4 stderr, fd 5 the ready pipe.
// It creates the log and signals ready, then, with a collector in arg,
// hands the pipes to it and returns; without one, or when none takes them
// in time, it copies them itself (Serve) until they end. Run any other way,
// closing fd 5 fails and it says so. Each failure is also sent, as it
// happens, to syslog at syslogAddr ("" for the local one, the journal on a
// systemd host; see Syslog): the shim gives the driver no stderr, and
// noderun may be down. serving, if not nil, runs once the driver is to
// write the log itself: only then does it live on, for as long as the
// container's output.
//
// Ready comes before the hand-over because the shim waits for it before
// `runc create`: the hand-over (two more processes woken, the collector
// opening the log and passing the pipes to its holder) took 1.8 ms of the
// path to a container's start here. Nothing is lost by it: the container
// writes nothing before its start, after runc's whole create, and until
// the collector has the pipes the driver holds them, and serves them itself
// if the hand-over fails.
func ServeFDs(arg, syslogAddr string, serving func()) error {
	t, err := ParseArg(arg)
	if err != nil {
		return err
	}
	stdout := os.NewFile(3, "stdout")
	stderr := os.NewFile(4, "stderr")
	ready := os.NewFile(5, "ready")
	defer stdout.Close()
	defer stderr.Close()
	report, flush := async(Syslog(syslogAddr, t.Path))
	defer flush()
	w, err := openReady(t, ready, report)
	if err != nil {
		return err
	}
	if t.Collector != "" {
		key := os.Getenv("CONTAINER_NAMESPACE") + "/" + os.Getenv("CONTAINER_ID")
		if key == "/" {
			key = t.Path
		}
		err := Handoff(t, key, int(stdout.Fd()), int(stderr.Fd()), handoffWait)
		if err == nil {
			return w.close()
		}
		report(fmt.Errorf("%w; this driver writes the log itself", err))
	}
	if serving != nil {
		serving()
	}
	return copyAll(w, stdout, stderr, report)
}

var errRefused = errors.New("crilog: the log collector refused the container")

// Handoff passes a container's pipes to the collector at t.Collector and
// returns once it took them, retrying for up to wait while no collector
// answers. A collector that registers the same key twice keeps the first.
func Handoff(t Target, key string, stdout, stderr int, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	buf := make([]byte, smallMessage)
	for {
		err := handoffOnce(t, key, stdout, stderr, buf)
		if err == nil || errors.Is(err, errRefused) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func handoffOnce(t Target, key string, stdout, stderr int, buf []byte) error {
	c, err := dialCollector(t.Collector, time.Second)
	if err != nil {
		return fmt.Errorf("crilog: log collector: %w", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if err := sendMsg(c, message{Op: opRegister, Key: key, Path: t.Path, Root: t.Root, Rotation: t.Rotation}, stdout, stderr); err != nil {
		return fmt.Errorf("crilog: log collector: %w", err)
	}
	m, fds, err := recvMsg(c, buf)
	closeFDs(fds)
	switch {
	case err != nil:
		return fmt.Errorf("crilog: log collector: %w", err)
	case m.Op == opFail:
		return fmt.Errorf("%w: %s", errRefused, m.Error)
	case m.Op != opAck:
		return fmt.Errorf("crilog: log collector answered %q", m.Op)
	}
	return nil
}

// Serve appends stdout and stderr to the CRI log file at path until both
// reach EOF. It closes ready once the file is open so the shim starts the
// container only when no output can be lost.
func Serve(path string, stdout, stderr io.Reader, ready io.Closer) error {
	return serve(Target{Path: path}, stdout, stderr, ready, func(error) {})
}

// serve is Serve, telling report of each failure when it happens.
func serve(t Target, stdout, stderr io.Reader, ready io.Closer, report func(error)) error {
	report, flush := async(report)
	defer flush()
	w, err := openReady(t, ready, report)
	if err != nil {
		return err
	}
	return copyAll(w, stdout, stderr, report)
}

// openReady opens the log, creating it, and then closes ready; report is
// told of a failure as well.
func openReady(t Target, ready io.Closer, report func(error)) (*recordWriter, error) {
	w := newRecordWriter(t, report)
	if err := w.open(true); err != nil {
		report(err)
		return nil, err
	}
	if err := ready.Close(); err != nil {
		w.close()
		err = fmt.Errorf("crilog: signal ready: %w", err)
		report(err)
		return nil, err
	}
	return w, nil
}

// copyAll copies both streams into w until both reach EOF. Output that
// cannot be written (a full disk) is dropped and counted, never left in
// the pipe: a container blocked on its next write would hang for good.
func copyAll(w *recordWriter, stdout, stderr io.Reader, report func(error)) error {
	reported := func(err error) error {
		if err != nil {
			report(err)
		}
		return err
	}
	errs := make(chan error, 2)
	go func() { errs <- reported(copyStream(w, stdout, Stdout)) }()
	go func() { errs <- reported(copyStream(w, stderr, Stderr)) }()
	err := errors.Join(<-errs, <-errs, w.firstErr)
	if cerr := w.close(); cerr != nil {
		err = errors.Join(err, reported(cerr))
	}
	return err
}

func newRecordWriter(t Target, report func(error)) *recordWriter {
	root := logRoot(t.Root, t.Path)
	w := &recordWriter{path: t.Path, root: root, now: time.Now, report: report}
	if t.Rotation.MaxSize > 0 {
		w.rot = &rotator{path: t.Path, root: root, r: t.Rotation, now: time.Now, report: report, create: createLog}
	}
	return w
}

// open opens the log file for appending, creating it; mkdir creates its
// directory first, which only a new container's log may need: the
// collector opens an adopted stream's log at its first record and must not
// recreate the directory of a pod removed meanwhile. Its log may be gone
// even so (a collector killed between a rotation's rename and create).
func (rw *recordWriter) open(mkdir bool) error {
	f, err := openLogFile(rw.root, rw.path, mkdir)
	if err != nil {
		return err
	}
	rw.w = f
	if rw.rot != nil {
		if fi, err := f.Stat(); err == nil {
			rw.rot.size = fi.Size()
		}
	}
	return nil
}

func (rw *recordWriter) close() error {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	f, ok := rw.w.(*os.File)
	if !ok {
		return nil
	}
	rw.w = nil
	return f.Close()
}

// Dropped is how many records could not be written since the writer
// started, and whether writes are failing now.
func (rw *recordWriter) Dropped() (total int64, dropping bool) {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	return rw.total, rw.dropped > 0
}

// async sends reports from a goroutine of their own, dropping them when
// it is behind: a report (to syslog, whose socket may be full under the
// same pressure that made the write fail) must never hold up the copy,
// or the container blocks. flush waits up to a second for what is queued.
func async(report func(error)) (send func(error), flush func()) {
	queue := make(chan error, 8)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for err := range queue {
			report(err)
		}
	}()
	// A rotation's tidying goroutine may still report after flush: its
	// reports are dropped then, never sent on the closed queue.
	var mu sync.Mutex
	closed := false
	send = func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if closed {
			return
		}
		select {
		case queue <- err:
		default:
		}
	}
	flush = func() {
		mu.Lock()
		closed = true
		close(queue)
		mu.Unlock()
		select {
		case <-done:
		case <-time.After(time.Second):
		}
	}
	return send, flush
}

// openLogFile opens the log at path for appending, creating it, without
// following links below root; mkdir creates its directory first. Tests
// replace it to make writes fail.
var openLogFile = func(root, path string, mkdir bool) (*os.File, error) {
	if mkdir {
		if err := os.MkdirAll(root, 0o755); err != nil {
			return nil, fmt.Errorf("crilog: create log dir: %w", err)
		}
	}
	dir, err := openDirBelow(root, filepath.Dir(path), mkdir)
	if err != nil {
		return nil, fmt.Errorf("crilog: open log: %w", err)
	}
	defer dir.Close()
	f, err := createLog(dir, filepath.Base(path))
	if err != nil {
		return nil, fmt.Errorf("crilog: open log: %w", err)
	}
	return f, nil
}

// recordWriter writes whole records under a mutex so the two streams never
// interleave within a line. A record it cannot write is dropped: the first
// failure and the recovery, with the count dropped, are reported.
type recordWriter struct {
	mu       sync.Mutex
	path     string
	root     string    // no link below it is followed
	w        io.Writer // nil until open
	now      func() time.Time
	report   func(error)
	rot      *rotator // nil: the file is never rotated
	dropped  int      // records dropped since writing last failed
	total    int64    // records dropped since the writer started
	firstErr error    // the first write failure
}

// write writes one record at once.
func (rw *recordWriter) write(stream, tag string, content []byte) {
	b := batch{w: rw, stream: stream}
	b.add(tag, content)
	b.flush()
}

// appendRecord formats one record onto p.
func (rw *recordWriter) appendRecord(p []byte, stream, tag string, content []byte) []byte {
	p = rw.now().AppendFormat(p, time.RFC3339Nano)
	p = append(p, ' ')
	p = append(p, stream...)
	p = append(p, ' ')
	p = append(p, tag...)
	p = append(p, ' ')
	p = append(p, content...)
	return append(p, '\n')
}

// writeRecords writes whole records (p ends with one) in as few writes as
// rotation allows: as when each record is written alone, the file is
// rotated after the record that takes it to MaxSize.
func (rw *recordWriter) writeRecords(p []byte) {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if rw.w == nil {
		// An adopted stream, or a log that could not be opened.
		if err := rw.open(false); err != nil {
			rw.failed(err, bytes.Count(p, []byte{'\n'}))
			return
		}
	}
	for len(p) > 0 {
		n := len(p)
		if rt := rw.rot; rt != nil {
			if need := rt.r.MaxSize - rt.size; need > 0 && need < int64(n) {
				n = int(need) + bytes.IndexByte(p[need-1:], '\n')
			}
		}
		rw.writeChunk(p[:n])
		p = p[n:]
		if rt := rw.rot; rt != nil && rt.due() {
			rw.w = rt.rotate(rw.w.(*os.File))
		}
	}
}

func (rw *recordWriter) writeChunk(p []byte) {
	written, err := rw.w.Write(p)
	if err == nil {
		if rw.dropped > 0 {
			rw.report(fmt.Errorf("crilog: writing again after dropping %d records", rw.dropped))
			rw.dropped = 0
		}
		if rw.rot != nil {
			rw.rot.size += int64(written)
		}
		return
	}
	if f, ok := rw.w.(*os.File); ok && written > 0 {
		// Cut the part a full disk let through, so the file stays
		// whole records.
		if fi, serr := f.Stat(); serr == nil {
			_ = f.Truncate(fi.Size() - int64(written))
		}
	}
	rw.failed(err, bytes.Count(p, []byte{'\n'}))
}

// failed drops n records that could not be written.
func (rw *recordWriter) failed(err error, n int) {
	if rw.dropped == 0 {
		rw.report(fmt.Errorf("crilog: write: %w; dropping output until writing works again", err))
	}
	if rw.firstErr == nil {
		rw.firstErr = fmt.Errorf("crilog: write: %w", err)
	}
	rw.dropped += n
	rw.total += int64(n)
}

// flushAt is the size at which a batch of records is written even though
// more input is waiting.
const flushAt = 32 << 10

// recordBufs hold batches while they are built: a stream waiting for
// input holds none, so an idle container costs no buffer.
var recordBufs = sync.Pool{New: func() any { b := make([]byte, 0, flushAt+4096); return &b }}

// batch gathers the records of what one read brought, so that they go to
// the file in one write instead of one write per line.
type batch struct {
	w      *recordWriter
	stream string
	buf    *[]byte // nil while empty
}

func (b *batch) add(tag string, content []byte) {
	if b.buf == nil {
		b.buf = recordBufs.Get().(*[]byte)
	}
	*b.buf = b.w.appendRecord(*b.buf, b.stream, tag, content)
	if len(*b.buf) >= flushAt {
		b.flush()
	}
}

func (b *batch) flush() {
	if b.buf == nil {
		return
	}
	b.w.writeRecords(*b.buf)
	if *b.buf = (*b.buf)[:0]; cap(*b.buf) <= 2*flushAt { // a huge line's buffer is not kept
		recordBufs.Put(b.buf)
	}
	b.buf = nil
}

// copyStream turns r into records the way containerd's CRI logger does: a
// line is written without its "\n" (or "\r\n") as F; content beyond
// MaxLineLen goes out as P records; an unterminated tail at EOF is written as
// P because its line never ended.
//
// The records of what one read brought are written together before the
// next read, so a line is in the file before the copy waits again.
func copyStream(w *recordWriter, r io.Reader, stream string) error {
	return copyTapped(w, r, stream, nil)
}

// copyTapped is copyStream that also hands each chunk read, as read, to
// tap (when not nil) before its records are written.
func copyTapped(w *recordWriter, r io.Reader, stream string, tap func([]byte)) error {
	cr := newChunkReader(r)
	b := &batch{w: w, stream: stream}
	var line []byte // the start of a line whose end has not come
	for {
		buf, n, rerr := cr.read()
		data := (*buf)[:n]
		if tap != nil && n > 0 {
			tap(data)
		}
		for len(data) > 0 {
			i := bytes.IndexByte(data, '\n')
			if i < 0 {
				line = append(line, data...)
				break
			}
			full := data[:i+1]
			if len(line) > 0 {
				line = append(line, full...)
				full = line
			}
			data = data[i+1:]
			full = trimEOL(full)
			for len(full) > MaxLineLen {
				b.add(tagPartial, full[:MaxLineLen])
				full = full[MaxLineLen:]
			}
			b.add(tagFull, full)
			line = line[:0]
		}
		for splitLen(line, false) > MaxLineLen {
			b.add(tagPartial, line[:MaxLineLen])
			line = append(line[:0], line[MaxLineLen:]...)
		}
		b.flush()
		readBufs.Put(buf)
		if rerr != nil {
			return finish(b, line, rerr)
		}
	}
}

// readSize is what one read takes at most, from a pooled buffer: a stream
// waiting for input holds none.
const readSize = 64 << 10

var readBufs = sync.Pool{New: func() any { b := make([]byte, readSize); return &b }}

// chunkReader reads into pooled buffers. A pipe in Go's poller is read
// through its RawConn, so that the buffer is taken only once data is
// there; any other reader holds one while its Read blocks.
type chunkReader struct {
	r   io.Reader
	raw syscall.RawConn
}

func newChunkReader(r io.Reader) *chunkReader {
	c := &chunkReader{r: r}
	f, ok := r.(*os.File)
	if !ok {
		return c
	}
	raw, err := f.SyscallConn() // not f.Fd(), which would make the pipe blocking
	if err != nil {
		return c
	}
	nonblock := false
	_ = raw.Control(func(fd uintptr) {
		fl, err := unix.FcntlInt(fd, unix.F_GETFL, 0)
		nonblock = err == nil && fl&unix.O_NONBLOCK != 0
	})
	if nonblock {
		c.raw = raw
	}
	return c
}

// read returns a buffer (to put back in readBufs), how much of it holds
// data and the read's error; io.EOF at the end.
func (c *chunkReader) read() (*[]byte, int, error) {
	if c.raw == nil {
		buf := readBufs.Get().(*[]byte)
		n, err := c.r.Read(*buf)
		return buf, n, err
	}
	var buf *[]byte
	var n int
	var rerr error
	err := c.raw.Read(func(fd uintptr) bool {
		buf = readBufs.Get().(*[]byte)
		n, rerr = unix.Read(int(fd), *buf)
		if rerr == unix.EAGAIN || rerr == unix.EINTR {
			readBufs.Put(buf)
			return false // wait until there is data
		}
		return true
	})
	switch {
	case err != nil:
		if buf == nil {
			buf = readBufs.Get().(*[]byte)
		}
		return buf, 0, err
	case rerr != nil:
		return buf, 0, rerr
	case n == 0:
		return buf, 0, io.EOF
	}
	return buf, n, nil
}

// splitLen is the length that counts against MaxLineLen: a trailing "\r" of
// an unfinished line may still turn out to be half of "\r\n".
func splitLen(line []byte, complete bool) int {
	n := len(line)
	if !complete && n > 0 && line[n-1] == '\r' {
		n--
	}
	return n
}

func finish(b *batch, line []byte, rerr error) error {
	if len(line) > 0 {
		b.add(tagPartial, line)
	}
	b.flush()
	if rerr == io.EOF {
		return nil
	}
	return fmt.Errorf("crilog: read %s: %w", b.stream, rerr)
}

func trimEOL(line []byte) []byte {
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line
}

// ParseLine splits one CRI log record, with or without its trailing newline.
func ParseLine(line string) (t time.Time, stream string, partial bool, content string, err error) {
	parts := strings.SplitN(strings.TrimSuffix(line, "\n"), " ", 4)
	if len(parts) != 4 {
		return time.Time{}, "", false, "", fmt.Errorf("%w: %q", ErrBadLine, line)
	}
	t, err = time.Parse(time.RFC3339Nano, parts[0])
	if err != nil {
		return time.Time{}, "", false, "", fmt.Errorf("%w: timestamp: %w", ErrBadLine, err)
	}
	stream = parts[1]
	if stream != Stdout && stream != Stderr {
		return time.Time{}, "", false, "", fmt.Errorf("%w: stream %q", ErrBadLine, stream)
	}
	switch parts[2] {
	case tagFull:
	case tagPartial:
		partial = true
	default:
		return time.Time{}, "", false, "", fmt.Errorf("%w: tag %q", ErrBadLine, parts[2])
	}
	return t, stream, partial, parts[3], nil
}
