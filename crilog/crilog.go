// Package crilog is a containerd binary log driver that writes container
// output in the CRI log format, so that kubectl-style tooling and the kubelet's
// parser can read noderun's container logs.
//
// containerd's shim starts the driver named by a binary:// log URI with the
// container's stdout on fd 3, its stderr on fd 4 and a pipe on fd 5 that the
// driver closes once it is ready to receive output.
package crilog

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
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
// `exe log-driver logPath`. It has exactly one query key because the shim
// builds the argument list by iterating over a map.
func URI(exe, logPath string) string {
	u := url.URL{
		Scheme:   "binary",
		Path:     exe,
		RawQuery: url.Values{"log-driver": {logPath}}.Encode(),
	}
	return u.String()
}

// ServeFDs runs Serve on the descriptors containerd's shim passes to a binary
// log driver: fd 3 stdout, fd 4 stderr, fd 5 the ready pipe. Run any other
// way, closing fd 5 fails and Serve says so. Each failure is also sent, as it
// happens, to syslog at syslogAddr ("" for the local one, the journal on a
// systemd host; see Syslog): the shim gives the driver no stderr, and
// noderun may be down.
func ServeFDs(arg, syslogAddr string) error {
	path, rot, err := ParseArg(arg)
	if err != nil {
		return err
	}
	stdout := os.NewFile(3, "stdout")
	stderr := os.NewFile(4, "stderr")
	ready := os.NewFile(5, "ready")
	defer stdout.Close()
	defer stderr.Close()
	return serve(path, rot, stdout, stderr, ready, Syslog(syslogAddr, path))
}

// Serve appends stdout and stderr to the CRI log file at path until both
// reach EOF. It closes ready once the file is open so the shim starts the
// container only when no output can be lost.
func Serve(path string, stdout, stderr io.Reader, ready io.Closer) error {
	return serve(path, Rotation{}, stdout, stderr, ready, func(error) {})
}

// serve is Serve, telling report of each failure when it happens. Output
// that cannot be written (a full disk) is dropped and counted, never left
// in the pipe: a container blocked on its next write would hang for good.
func serve(path string, rot Rotation, stdout, stderr io.Reader, ready io.Closer, report func(error)) error {
	report, flush := async(report)
	defer flush()
	reported := func(err error) error {
		if err != nil {
			report(err)
		}
		return err
	}
	f, err := openLog(path)
	if err != nil {
		return reported(err)
	}
	w := &recordWriter{w: f, now: time.Now, report: report}
	if rot.MaxSize > 0 {
		w.rot = &rotator{path: path, r: rot, now: time.Now, report: report}
		if fi, err := f.Stat(); err == nil {
			w.rot.size = fi.Size()
		}
	}
	if err := ready.Close(); err != nil {
		f.Close()
		return reported(fmt.Errorf("crilog: signal ready: %w", err))
	}

	errs := make(chan error, 2)
	go func() { errs <- reported(copyStream(w, stdout, Stdout)) }()
	go func() { errs <- reported(copyStream(w, stderr, Stderr)) }()
	err = errors.Join(<-errs, <-errs, w.firstErr)
	if cerr := w.w.(*os.File).Close(); cerr != nil {
		err = errors.Join(err, reported(cerr))
	}
	return err
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
	send = func(err error) {
		select {
		case queue <- err:
		default:
		}
	}
	flush = func() {
		close(queue)
		select {
		case <-done:
		case <-time.After(time.Second):
		}
	}
	return send, flush
}

func openLog(path string) (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("crilog: create log dir: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
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
	w        io.Writer
	now      func() time.Time
	report   func(error)
	buf      []byte
	rot      *rotator // nil: the file is never rotated
	dropped  int      // records dropped since writing last failed
	firstErr error    // the first write failure
}

func (rw *recordWriter) write(stream, tag string, content []byte) {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	b := rw.now().AppendFormat(rw.buf[:0], time.RFC3339Nano)
	b = append(b, ' ')
	b = append(b, stream...)
	b = append(b, ' ')
	b = append(b, tag...)
	b = append(b, ' ')
	b = append(b, content...)
	b = append(b, '\n')
	rw.buf = b
	n, err := rw.w.Write(b)
	if err == nil {
		if rw.dropped > 0 {
			rw.report(fmt.Errorf("crilog: writing again after dropping %d records", rw.dropped))
			rw.dropped = 0
		}
		if rw.rot != nil {
			if rw.rot.size += int64(n); rw.rot.size >= rw.rot.r.MaxSize {
				rw.w = rw.rot.rotate(rw.w.(*os.File))
			}
		}
		return
	}
	if f, ok := rw.w.(*os.File); ok && n > 0 {
		// Cut the half record a full disk let through, so the file
		// stays whole records.
		if fi, serr := f.Stat(); serr == nil {
			_ = f.Truncate(fi.Size() - int64(n))
		}
	}
	if rw.dropped == 0 {
		rw.report(fmt.Errorf("crilog: write: %w; dropping output until writing works again", err))
	}
	if rw.firstErr == nil {
		rw.firstErr = fmt.Errorf("crilog: write: %w", err)
	}
	rw.dropped++
}

// copyStream turns r into records the way containerd's CRI logger does: a
// line is written without its "\n" (or "\r\n") as F; content beyond
// MaxLineLen goes out as P records; an unterminated tail at EOF is written as
// P because its line never ended.
func copyStream(w *recordWriter, r io.Reader, stream string) error {
	br := bufio.NewReaderSize(r, 4096)
	var line []byte
	for {
		chunk, rerr := br.ReadSlice('\n')
		line = append(line, chunk...)
		complete := rerr == nil
		if complete {
			line = trimEOL(line)
		}
		for splitLen(line, complete) > MaxLineLen {
			w.write(stream, tagPartial, line[:MaxLineLen])
			line = append(line[:0], line[MaxLineLen:]...)
		}
		switch {
		case complete:
			w.write(stream, tagFull, line)
			line = line[:0]
		case rerr == bufio.ErrBufferFull:
		default:
			return finish(w, stream, line, rerr)
		}
	}
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

func finish(w *recordWriter, stream string, line []byte, rerr error) error {
	if len(line) > 0 {
		w.write(stream, tagPartial, line)
	}
	if rerr == io.EOF {
		return nil
	}
	return fmt.Errorf("crilog: read %s: %w", stream, rerr)
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
