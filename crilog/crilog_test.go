package crilog

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"golang.org/x/sys/unix"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/noderun/noderun/internal/testenv"
)

type record struct {
	stream  string
	partial bool
	content string
}

// runsItself is why tests that start their own binary again skip under
// qemu-user: the kernel cannot execute a foreign-architecture test binary
// without binfmt_misc.
const runsItself = "it runs itself again: the kernel cannot execute this foreign-architecture test binary without binfmt_misc"

func TestURI(t *testing.T) {
	got := URI("/usr/local/bin/noderun", Target{Path: "/var/log/pods/ns_p_uid/c/0.log"})
	want := "binary:///usr/local/bin/noderun?log-driver=%2Fvar%2Flog%2Fpods%2Fns_p_uid%2Fc%2F0.log"
	if got != want {
		t.Fatalf("URI = %q, want %q", got, want)
	}
	// What the shim does with it: path is the binary, the query the args.
	u, err := url.Parse(got)
	if err != nil {
		t.Fatal(err)
	}
	if u.Scheme != "binary" || u.Path != "/usr/local/bin/noderun" || u.Query().Get("log-driver") != "/var/log/pods/ns_p_uid/c/0.log" {
		t.Fatalf("parsed URI = %#v", u)
	}
}

func TestCopyStream(t *testing.T) {
	long := strings.Repeat("a", MaxLineLen)
	tests := []struct {
		name string
		in   string
		want []record
	}{
		{"empty", "", nil},
		{"lines", "one\ntwo\n", []record{{Stdout, false, "one"}, {Stdout, false, "two"}}},
		{"empty line", "\n", []record{{Stdout, false, ""}}},
		{"crlf", "dos\r\n", []record{{Stdout, false, "dos"}}},
		{"unterminated tail", "a\nb", []record{{Stdout, false, "a"}, {Stdout, true, "b"}}},
		{"exactly max", long + "\n", []record{{Stdout, false, long}}},
		{"exactly max crlf", long + "\r\n", []record{{Stdout, false, long}}},
		{"max plus one", long + "b\n", []record{{Stdout, true, long}, {Stdout, false, "b"}}},
		{"three pieces", long + long + "tail\n", []record{{Stdout, true, long}, {Stdout, true, long}, {Stdout, false, "tail"}}},
		{"long unterminated", long + "x", []record{{Stdout, true, long}, {Stdout, true, "x"}}},
		{"spaces kept", "  a b  \n", []record{{Stdout, false, "  a b  "}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			w := &recordWriter{w: &out, now: time.Now}
			if err := copyStream(w, strings.NewReader(tt.in), Stdout); err != nil {
				t.Fatal(err)
			}
			assertRecords(t, out.String(), tt.want)
		})
	}
}

func TestRecordFormat(t *testing.T) {
	var out bytes.Buffer
	at := time.Date(2024, 5, 6, 7, 8, 9, 123456789, time.UTC)
	w := &recordWriter{w: &out, now: func() time.Time { return at }}
	w.write(Stderr, tagPartial, []byte("hi there"))
	if want := "2024-05-06T07:08:09.123456789Z stderr P hi there\n"; out.String() != want {
		t.Fatalf("got %q, want %q", out.String(), want)
	}
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

func TestCopyStreamReadError(t *testing.T) {
	boom := errors.New("boom")
	w := &recordWriter{w: io.Discard, now: time.Now}
	err := copyStream(w, io.MultiReader(strings.NewReader("x"), errReader{boom}), Stdout)
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want %v", err, boom)
	}
}

type closeRecorder struct {
	mu     sync.Mutex
	closed bool
}

func (c *closeRecorder) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	return nil
}

func (c *closeRecorder) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// TestServe drives both streams through real pipes, as the shim does, and
// checks readiness, per-stream order, whole lines and the file mode.
func TestServe(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pods", "c", "0.log")
	outR, outW := io.Pipe()
	errR, errW := io.Pipe()
	ready := &closeRecorder{}
	done := make(chan error, 1)
	go func() { done <- Serve(path, outR, errR, ready) }()

	const n = 200
	var wg sync.WaitGroup
	wg.Add(2)
	go writeLines(t, &wg, outW, "out", n)
	go writeLines(t, &wg, errW, "err", n)
	wg.Wait()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !ready.isClosed() {
		t.Fatal("ready was not closed")
	}

	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o640 {
		t.Errorf("mode = %v, want 0640", fi.Mode().Perm())
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, line := range strings.SplitAfter(strings.TrimSuffix(string(data), "\n"), "\n") {
		_, stream, partial, content, err := ParseLine(line)
		if err != nil {
			t.Fatal(err)
		}
		prefix := map[string]string{Stdout: "out", Stderr: "err"}[stream]
		want := lineContent(prefix, seen[stream])
		if partial || content != want {
			t.Fatalf("%s record %d = %q (partial %v), want %q", stream, seen[stream], content, partial, want)
		}
		seen[stream]++
	}
	if seen[Stdout] != n || seen[Stderr] != n {
		t.Fatalf("records per stream = %v, want %d each", seen, n)
	}
}

func TestServeAppends(t *testing.T) {
	path := filepath.Join(t.TempDir(), "0.log")
	for _, text := range []string{"first\n", "second\n"} {
		if err := Serve(path, strings.NewReader(text), strings.NewReader(""), &closeRecorder{}); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	assertRecords(t, string(data), []record{{Stdout, false, "first"}, {Stdout, false, "second"}})
}

func lineContent(prefix string, i int) string {
	// Long enough that a write of one line is several pipe reads.
	return prefix + strings.Repeat("-", 5000) + string(rune('a'+i%26))
}

func writeLines(t *testing.T, wg *sync.WaitGroup, w *io.PipeWriter, prefix string, n int) {
	defer wg.Done()
	bw := bufio.NewWriterSize(w, 1000)
	for i := range n {
		if _, err := bw.WriteString(lineContent(prefix, i) + "\n"); err != nil {
			t.Error(err)
			break
		}
	}
	if err := bw.Flush(); err != nil {
		t.Error(err)
	}
	w.Close()
}

func assertRecords(t *testing.T, out string, want []record) {
	t.Helper()
	var got []record
	prev := time.Time{}
	for _, line := range strings.SplitAfter(out, "\n") {
		if line == "" {
			continue
		}
		ts, stream, partial, content, err := ParseLine(line)
		if err != nil {
			t.Fatal(err)
		}
		if ts.Before(prev) {
			t.Errorf("timestamp %v before %v", ts, prev)
		}
		prev = ts
		got = append(got, record{stream, partial, content})
	}
	if len(got) != len(want) {
		t.Fatalf("got %d records, want %d: %.200v", len(got), len(want), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("record %d = %.100v, want %.100v", i, got[i], want[i])
		}
	}
}

func TestParseLine(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		stream  string
		partial bool
		content string
		wantErr bool
	}{
		{"full", "2024-01-02T03:04:05.000000006Z stdout F hello world\n", Stdout, false, "hello world", false},
		{"partial no newline", "2024-01-02T03:04:05+02:00 stderr P x", Stderr, true, "x", false},
		{"empty content", "2024-01-02T03:04:05Z stdout F ", Stdout, false, "", false},
		{"bad time", "yesterday stdout F x", "", false, "", true},
		{"bad stream", "2024-01-02T03:04:05Z stdin F x", "", false, "", true},
		{"bad tag", "2024-01-02T03:04:05Z stdout X x", "", false, "", true},
		{"too short", "2024-01-02T03:04:05Z stdout F", "", false, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, stream, partial, content, err := ParseLine(tt.in)
			if tt.wantErr {
				if !errors.Is(err, ErrBadLine) {
					t.Fatalf("err = %v, want ErrBadLine", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if stream != tt.stream || partial != tt.partial || content != tt.content {
				t.Fatalf("got %q %v %q", stream, partial, content)
			}
		})
	}
}

// TestServeFDs runs the test binary as the driver the way the shim does
// (startDriver): ExtraFiles become fds 3 (stdout), 4 (stderr) and 5
// (ready).
func TestServeFDs(t *testing.T) {
	if path := os.Getenv("CRILOG_HELPER_PATH"); path != "" {
		serving := func() {
			if marker := os.Getenv("CRILOG_HELPER_SERVING"); marker != "" {
				os.WriteFile(marker, nil, 0o644)
			}
		}
		if err := ServeFDs(path, os.Getenv("CRILOG_HELPER_SYSLOG"), serving); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	testenv.SkipIfEmulated(t, runsItself)
	path := filepath.Join(t.TempDir(), "0.log")
	serving := filepath.Join(t.TempDir(), "serving")
	d := startDriver(t, "CRILOG_HELPER_PATH="+path, "CRILOG_HELPER_SERVING="+serving)
	// Like the shim: block until the driver closes its end of the ready pipe.
	if _, err := d.ready.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("ready read = %v, want EOF", err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("log file not created before ready: %v", err)
	}
	io.WriteString(d.stdout, "to stdout\n")
	io.WriteString(d.stderr, "to stderr\n")
	d.stdout.Close()
	d.stderr.Close()
	if err := d.cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	got := string(data)
	if !strings.Contains(got, " stdout F to stdout\n") || !strings.Contains(got, " stderr F to stderr\n") {
		t.Fatalf("log = %q", got)
	}
	if _, err := os.Stat(serving); err != nil {
		t.Errorf("a driver writing the log itself did not call serving: %v", err)
	}
}

// A driver that hands its pipes to the collector exits at once, without
// calling serving (noderun's trim of its binary pages, which would only
// delay the container's start); the collector writes the log.
func TestServeFDsHandsOffWithoutServing(t *testing.T) {
	testenv.SkipIfEmulated(t, runsItself)
	dir := t.TempDir()
	procs := &collectorProcs{t: t, sock: filepath.Join(dir, "c.sock")}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go NewHolder(procs.sock, procs.start, slog.New(slog.DiscardHandler)).Run(ctx)

	path := filepath.Join(dir, "pod", "0.log")
	serving := filepath.Join(dir, "serving")
	d := startDriver(t, "CRILOG_HELPER_PATH="+Target{Path: path, Collector: procs.sock}.Arg(), "CRILOG_HELPER_SERVING="+serving)
	if err := d.cmd.Wait(); err != nil {
		t.Fatalf("driver: %v", err)
	}
	if _, err := d.ready.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("ready read = %v, want EOF", err)
	}
	if _, err := os.Stat(serving); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a driver that handed its pipes over called serving (%v)", err)
	}
	io.WriteString(d.stdout, "handed over\n")
	waitFor(t, "the collector to write the log", func() bool {
		b, _ := os.ReadFile(path)
		return strings.Contains(string(b), " stdout F handed over\n")
	})
	d.stderr.Close()
}

// The driver signals ready before it hands its pipes over, since the shim
// waits for it before runc create; a collector that then refuses them
// loses nothing: the driver writes the log itself.
func TestServeFDsReadyBeforeHandoff(t *testing.T) {
	testenv.SkipIfEmulated(t, runsItself)
	dir := t.TempDir()
	sock := filepath.Join(dir, "c.sock")
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: sock, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	refuse := make(chan struct{})
	go func() {
		c, err := l.AcceptUnix()
		if err != nil {
			return
		}
		defer c.Close()
		_, fds, _ := recvMsg(c, make([]byte, smallMessage))
		closeFDs(fds)
		<-refuse
		_ = sendMsg(c, message{Op: opFail, Error: "refused by the test"})
	}()

	path := filepath.Join(dir, "pod", "0.log")
	serving := filepath.Join(dir, "serving")
	d := startDriver(t, "CRILOG_HELPER_PATH="+Target{Path: path, Collector: sock}.Arg(), "CRILOG_HELPER_SERVING="+serving)
	d.ready.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := d.ready.Read(make([]byte, 1)); err != io.EOF {
		close(refuse)
		t.Fatalf("ready read = %v while the collector holds the hand-over, want EOF", err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Errorf("log file not created before ready: %v", err)
	}
	io.WriteString(d.stdout, "before the refusal\n")
	close(refuse)
	io.WriteString(d.stderr, "after it\n")
	d.stdout.Close()
	d.stderr.Close()
	if err := d.cmd.Wait(); err != nil {
		t.Fatalf("driver: %v", err)
	}
	b, _ := os.ReadFile(path)
	if got := string(b); !strings.Contains(got, " stdout F before the refusal\n") || !strings.Contains(got, " stderr F after it\n") {
		t.Errorf("log = %q, want both lines", got)
	}
	if _, err := os.Stat(serving); err != nil {
		t.Errorf("a driver left with its pipes did not call serving: %v", err)
	}
}

// driver is the test binary run as the log driver, the way the shim runs
// one (see TestServeFDs), with the parent's ends of its pipes.
type driver struct {
	cmd            *exec.Cmd
	stdout, stderr *os.File // the container's side
	ready          *os.File // the shim's side
}

func startDriver(t *testing.T, env ...string) *driver {
	t.Helper()
	outR, outW := mustPipe(t)
	errR, errW := mustPipe(t)
	readyR, readyW := mustPipe(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestServeFDs$")
	cmd.Env = append(os.Environ(), env...)
	cmd.ExtraFiles = []*os.File{outR, errR, readyW}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	outR.Close()
	errR.Close()
	readyW.Close()
	return &driver{cmd: cmd, stdout: outW, stderr: errW, ready: readyR}
}

func mustPipe(t *testing.T) (*os.File, *os.File) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	return r, w
}

// A driver that cannot create its log (here a directory name over NAME_MAX)
// says so in syslog: the shim discards its stderr.
func TestServeFDsReportsFailure(t *testing.T) {
	testenv.SkipIfEmulated(t, runsItself)
	dir := t.TempDir()
	sock := filepath.Join(dir, "log.sock")
	l, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	path := filepath.Join(dir, strings.Repeat("x", 300), "0.log")
	d := startDriver(t, "CRILOG_HELPER_PATH="+path, "CRILOG_HELPER_SYSLOG="+sock)
	if err := d.cmd.Wait(); err == nil {
		t.Error("the driver succeeded")
	}
	d.stdout.Close()
	d.stderr.Close()
	if _, err := d.ready.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("ready read = %v, want EOF", err)
	}
	l.SetReadDeadline(time.Now().Add(30 * time.Second))
	buf := make([]byte, 4096)
	n, err := l.Read(buf)
	if err != nil {
		t.Fatalf("nothing reported to syslog: %v", err)
	}
	msg := string(buf[:n])
	if !strings.HasPrefix(msg, "<27>") || !strings.Contains(msg, SyslogTag+"[") ||
		!strings.Contains(msg, path+": crilog: create log dir: ") || !strings.Contains(msg, "file name too long") {
		t.Errorf("syslog message %q, want daemon.err (27), the tag, the log path and the cause", msg)
	}
}

// A stream whose writes fail (a full disk, here /dev/full) is reported at
// once, while the other stream still runs: the container may run for long.
func TestServeReportsWriteFailureAtOnce(t *testing.T) {
	reports := make(chan error, 2)
	errR, errW := io.Pipe()
	defer errW.Close()
	done := make(chan error, 1)
	go func() {
		done <- serve(fullDisk(t), strings.NewReader("line\n"), errR, &closeRecorder{}, func(err error) { reports <- err })
	}()
	select {
	case err := <-reports:
		if !errors.Is(err, syscall.ENOSPC) {
			t.Errorf("reported %v, want ENOSPC", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a failed write was not reported while the driver ran")
	}
	errW.Close()
	if err := <-done; !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("serve = %v, want ENOSPC", err)
	}
}

// fullDisk is a log whose writes fail with ENOSPC: the writer's log is
// /dev/full until the test ends.
func fullDisk(t *testing.T) Target {
	saved := openLogFile
	openLogFile = func(string, string, bool) (*os.File, error) { return os.OpenFile("/dev/full", os.O_WRONLY, 0) }
	t.Cleanup(func() { openLogFile = saved })
	return Target{Path: filepath.Join(t.TempDir(), "0.log")}
}

// flakyWriter fails with ENOSPC while full is set, like a full disk.
type flakyWriter struct {
	bytes.Buffer
	full bool
}

func (w *flakyWriter) Write(b []byte) (int, error) {
	if w.full {
		return 0, syscall.ENOSPC
	}
	return w.Buffer.Write(b)
}

// Output that cannot be written is dropped and counted, never left in the
// pipe (the container would block on its next write and hang), and
// writing goes on once space returns.
func TestWriteFailureDropsAndResumes(t *testing.T) {
	var reports []string
	out := &flakyWriter{}
	w := &recordWriter{w: out, now: time.Now, report: func(err error) { reports = append(reports, err.Error()) }}
	w.write(Stdout, tagFull, []byte("before"))
	out.full = true
	for range 1000 {
		w.write(Stdout, tagFull, []byte("lost"))
	}
	out.full = false
	w.write(Stdout, tagFull, []byte("after"))
	assertRecords(t, out.String(), []record{{Stdout, false, "before"}, {Stdout, false, "after"}})
	if len(reports) != 2 || !strings.Contains(reports[0], "no space left") || !strings.Contains(reports[1], "dropping 1000 records") {
		t.Fatalf("reports %q, want the failure once, then the recovery with the count", reports)
	}
	if !errors.Is(w.firstErr, syscall.ENOSPC) {
		t.Fatalf("first error %v, want ENOSPC kept for the exit status", w.firstErr)
	}
}

// A writer into a full disk (/dev/full) is never blocked: the driver
// drains everything it is sent.
func TestServeNeverBlocksTheWriterOnAFullDisk(t *testing.T) {
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- serve(fullDisk(t), outR, strings.NewReader(""), &closeRecorder{}, func(error) {})
	}()
	line := []byte(strings.Repeat("x", 1023) + "\n")
	wrote := make(chan struct{})
	go func() {
		for range 4096 { // 4 MiB, far beyond a pipe's buffer
			outW.Write(line)
		}
		outW.Close()
		close(wrote)
	}()
	select {
	case <-wrote:
	case <-time.After(20 * time.Second):
		t.Fatal("the container's writes blocked on a full disk")
	}
	if err := <-done; !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("serve = %v, want ENOSPC reported", err)
	}
}

// A report that blocks (syslog's socket full) never holds up the copy.
func TestBlockedReportNeverBlocksTheWriter(t *testing.T) {
	block := make(chan struct{})
	defer close(block)
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- serve(fullDisk(t), outR, strings.NewReader(""), &closeRecorder{}, func(error) { <-block })
	}()
	wrote := make(chan struct{})
	go func() {
		for range 1024 {
			outW.Write([]byte(strings.Repeat("x", 1023) + "\n"))
		}
		outW.Close()
		close(wrote)
	}()
	select {
	case <-wrote:
	case <-time.After(20 * time.Second):
		t.Fatal("the container's writes blocked behind a blocked report")
	}
	<-done
}

// Lines that came with the start of an unfinished one are written without
// waiting for its end: the copy must not sit on them in a blocking read.
func TestLinesNotHeldBehindAPartialLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "0.log")
	w := newRecordWriter(Target{Path: path}, func(error) {})
	if err := w.open(true); err != nil {
		t.Fatal(err)
	}
	defer w.close()
	r, pw := mustPipe(t)
	go copyStream(w, r, Stdout)
	if _, err := io.WriteString(pw, "one\ntwo\nthe start of thr"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		data, _ := os.ReadFile(path)
		if strings.Contains(string(data), " stdout F one\n") && strings.Contains(string(data), " stdout F two\n") {
			if strings.Contains(string(data), "thr") {
				t.Fatalf("the unfinished line was written: %q", data)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("whole lines held back behind an unfinished one: log %q", data)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The collector's pipes (non-blocking, in Go's poller) are read through
// their RawConn, so a waiting stream holds no read buffer; other readers
// read plainly.
func TestChunkReaderPollsNonblockingPipes(t *testing.T) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		t.Fatal(err)
	}
	r, w := os.NewFile(uintptr(p[0]), "r"), os.NewFile(uintptr(p[1]), "w")
	defer r.Close()
	defer w.Close()
	if c := newChunkReader(r); c.raw == nil {
		t.Error("a non-blocking pipe is not read through its RawConn")
	}
	var b [2]int // as the shim passes them to a driver
	if err := unix.Pipe2(b[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	br, bw := os.NewFile(uintptr(b[0]), "r"), os.NewFile(uintptr(b[1]), "w")
	defer br.Close()
	defer bw.Close()
	if c := newChunkReader(br); c.raw != nil {
		t.Error("a blocking pipe is read through its RawConn")
	}
	io.WriteString(w, "x\n")
	buf, n, err := newChunkReader(r).read()
	if err != nil || string((*buf)[:n]) != "x\n" {
		t.Errorf("read %q, %v", (*buf)[:n], err)
	}
	w.Close()
	if _, _, err := newChunkReader(r).read(); err != io.EOF {
		t.Errorf("after close: %v, want EOF", err)
	}
}
