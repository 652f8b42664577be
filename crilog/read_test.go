package crilog

import (
	"bytes"
	"compress/gzip"
	"context"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// rec is one CRI record at t0 plus sec seconds.
func rec(sec int, stream, tag, content string) string {
	return t0.Add(time.Duration(sec)*time.Second).Format(time.RFC3339Nano) + " " + stream + " " + tag + " " + content + "\n"
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o640); err != nil {
		t.Fatal(err)
	}
}

func writeGz(t *testing.T, path, content string) {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	zw.Write([]byte(content))
	zw.Close()
	writeFile(t, path, b.String())
}

// rotatedLog is a log with two rotated files, the older gzipped, as
// rotate.go leaves them, and a malformed line and partial records.
func rotatedLog(t *testing.T) string {
	dir := t.TempDir()
	path := filepath.Join(dir, "0.log")
	writeGz(t, path+".20260102-030405.gz", rec(0, Stdout, "F", "one")+rec(1, Stderr, "F", "two"))
	writeFile(t, path+".20260102-030406", rec(2, Stdout, "P", "thr")+rec(2, Stderr, "F", "four")+rec(3, Stdout, "F", "ee"))
	writeFile(t, path, "garbage\n"+rec(4, Stdout, "F", "five")+rec(5, Stdout, "F", "six"))
	// Another run's log is not part of this one.
	writeFile(t, filepath.Join(dir, "1.log"), rec(9, Stdout, "F", "other run"))
	return path
}

func TestReadLog(t *testing.T) {
	path := rotatedLog(t)
	all := "one\ntwo\nfour\nthree\nfive\nsix\n"
	tests := []struct {
		name string
		opts ReadOptions
		want string
	}{
		{"all", ReadOptions{TailLines: -1}, all},
		{"tail", ReadOptions{TailLines: 2}, "five\nsix\n"},
		{"tail across files", ReadOptions{TailLines: 4}, "four\nthree\nfive\nsix\n"},
		{"tail zero", ReadOptions{TailLines: 0}, ""},
		{"tail more than there is", ReadOptions{TailLines: 100}, all},
		{"tail ending a rotated file", ReadOptions{TailLines: 3}, "three\nfive\nsix\n"},
		{"tail into the gzipped file", ReadOptions{TailLines: 5}, "two\nfour\nthree\nfive\nsix\n"},
		{"tail all there is", ReadOptions{TailLines: 6}, all},
		{"since and tail across files", ReadOptions{TailLines: 3, Since: t0.Add(2 * time.Second)}, "three\nfive\nsix\n"},
		{"since and tail more than since has", ReadOptions{TailLines: 5, Since: t0.Add(2 * time.Second)}, "four\nthree\nfive\nsix\n"},
		{"limit and tail across files", ReadOptions{TailLines: 5, LimitBytes: 6}, "two\nfo"},
		{"since", ReadOptions{TailLines: -1, Since: t0.Add(2 * time.Second)}, "four\nthree\nfive\nsix\n"},
		{"since and tail", ReadOptions{TailLines: 1, Since: t0.Add(2 * time.Second)}, "six\n"},
		{"limit cuts a line", ReadOptions{TailLines: -1, LimitBytes: 10}, "one\ntwo\nfo"},
		{"limit and tail", ReadOptions{TailLines: 2, LimitBytes: 3}, "fiv"},
		{"timestamps", ReadOptions{TailLines: 1, Timestamps: true}, "2026-01-02T03:04:10Z six\n"},
		{"joined line takes its first part's time", ReadOptions{TailLines: 3, Timestamps: true},
			"2026-01-02T03:04:07Z three\n2026-01-02T03:04:09Z five\n2026-01-02T03:04:10Z six\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			if err := ReadLog(context.Background(), path, &out, tt.opts); err != nil {
				t.Fatal(err)
			}
			if out.String() != tt.want {
				t.Errorf("got %q, want %q", out.String(), tt.want)
			}
		})
	}
}

func TestReadLogEdges(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	if err := ReadLog(context.Background(), filepath.Join(dir, "none.log"), &out, ReadOptions{TailLines: -1}); err != nil || out.Len() != 0 {
		t.Errorf("missing log: %q, %v; want empty, nil", out.String(), err)
	}
	// The container's unterminated last output is written as P; it is a
	// line of its own at the end. A line longer than the reader's buffer
	// is read whole.
	long := strings.Repeat("x", 10000)
	path := filepath.Join(dir, "[0].log") // glob characters in the name
	writeFile(t, path+".20260102-030405", rec(0, Stdout, "F", "rotated"))
	writeFile(t, path, rec(1, Stdout, "F", long)+rec(2, Stdout, "P", "no newline"))
	out.Reset()
	if err := ReadLog(context.Background(), path, &out, ReadOptions{TailLines: -1}); err != nil {
		t.Fatal(err)
	}
	if want := "rotated\n" + long + "\nno newline\n"; out.String() != want {
		t.Errorf("got %q, want %q", out.String(), want)
	}
}

// syncBuffer is a bytes.Buffer safe for a follower and a test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func appendFile(t *testing.T, path, content string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(content); err != nil {
		t.Fatal(err)
	}
}

// A follow writes appended lines, a record written in two pieces once
// whole, partial records once their line ends, moves to the new file
// when the log rotates, and ends once the container has ended.
func TestReadLogFollow(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "0.log")
	writeFile(t, path, rec(0, Stdout, "F", "old")+rec(1, Stdout, "F", "last"))
	ended := make(chan struct{})
	out := &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- ReadLog(context.Background(), path, out, ReadOptions{Follow: true, TailLines: 1, Ended: ended})
	}()
	waitFor(t, "the tail", func() bool { return out.String() == "last\n" })

	r := rec(2, Stdout, "F", "appended")
	appendFile(t, path, r[:10])
	appendFile(t, path, r[10:]+rec(3, Stderr, "P", "jo"))
	waitFor(t, "an appended line", func() bool { return out.String() == "last\nappended\n" })
	appendFile(t, path, rec(3, Stderr, "F", "ined"))
	waitFor(t, "a joined line", func() bool { return out.String() == "last\nappended\njoined\n" })

	// Rotation as rotate.go does it: rename, then a new file.
	appendFile(t, path, rec(4, Stdout, "F", "before rotation"))
	if err := os.Rename(path, path+".20260102-030409"); err != nil {
		t.Fatal(err)
	}
	appendFile(t, path, rec(5, Stdout, "F", "after rotation"))
	waitFor(t, "the rotated log", func() bool {
		return strings.HasSuffix(out.String(), "before rotation\nafter rotation\n")
	})

	select {
	case err := <-done:
		t.Fatalf("follow ended while the container runs: %v", err)
	default:
	}
	close(ended)
	// The log driver's last write may come after the end is known.
	appendFile(t, path, rec(6, Stdout, "F", "the end"))
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("follow did not end after the container ended")
	}
	if !strings.HasSuffix(out.String(), "after rotation\nthe end\n") {
		t.Errorf("output %q misses the last line", out.String())
	}
}

// A follow of a log not written yet waits for it; ctx ends it.
func TestReadLogFollowWaitsForTheLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "0.log")
	ctx, cancel := context.WithCancel(context.Background())
	out := &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- ReadLog(ctx, path, out, ReadOptions{Follow: true, TailLines: -1})
	}()
	appendFile(t, path, rec(0, Stdout, "F", "first"))
	waitFor(t, "the new log", func() bool { return out.String() == "first\n" })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Attach reads from the log's end on, stdout and stderr apart.
func TestReadLogFromEndApart(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "0.log")
	writeFile(t, path+".20260102-030405", rec(0, Stdout, "F", "rotated"))
	writeFile(t, path, rec(1, Stdout, "F", "before")+rec(2, Stderr, "F", "before too"))
	ended := make(chan struct{})
	out, errOut := &syncBuffer{}, &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- ReadLog(context.Background(), path, out, ReadOptions{Follow: true, TailLines: 0, Stderr: errOut, Ended: ended})
	}()
	// Written once the follow runs: before that it would be skipped.
	waitFor(t, "the follow", func() bool {
		appendFile(t, path, rec(3, Stdout, "F", "ping"))
		time.Sleep(50 * time.Millisecond)
		return strings.Contains(out.String(), "ping\n")
	})
	appendFile(t, path, rec(4, Stdout, "F", "out")+rec(5, Stderr, "F", "err"))
	close(ended)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := strings.ReplaceAll(out.String(), "ping\n", ""); got != "out\n" {
		t.Errorf("stdout %q, want %q", got, "out\n")
	}
	if errOut.String() != "err\n" {
		t.Errorf("stderr %q, want %q", errOut.String(), "err\n")
	}
}

// A log created and written after the watch began but before it was first
// read gets a Create event that the follow sees after it opened the file:
// that is the file's creation, not a rotation, and nothing is read twice.
func TestReadLogFollowCreatedBeforeTheFirstRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "0.log")
	sub, err := follows.subscribe(path)
	if err != nil {
		t.Fatal(err)
	}
	defer follows.unsubscribe(sub)
	appendFile(t, path, rec(0, Stdout, "F", "first"))
	out := &syncBuffer{}
	lr := &logReader{opts: ReadOptions{Follow: true, TailLines: -1}, out: out, errOut: out, pending: map[string]*joined{},
		root: filepath.Dir(path), name: filepath.Base(path)}
	if err := lr.openDir(path); err != nil {
		t.Fatal(err)
	}
	defer lr.dir.Close()
	live, err := lr.read(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- lr.follow(ctx, path, live, sub) }()
	appendFile(t, path, rec(1, Stdout, "F", "second"))
	waitFor(t, "the second line", func() bool { return strings.Contains(out.String(), "second") })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := out.String(); got != "first\nsecond\n" {
		t.Errorf("output %q, want each line once", got)
	}
}

// heapAtFirstWrite notes the heap in use when the first output is written:
// a tail held in memory is all there at that moment.
type heapAtFirstWrite struct {
	heap uint64
	n    int
}

func (h *heapAtFirstWrite) Write(p []byte) (int, error) {
	if h.n == 0 {
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		h.heap = m.HeapAlloc
	}
	h.n += len(p)
	return len(p), nil
}

// tailLog writes a log of about size bytes: a gzipped rotated file whose
// last line says so, a plain one of a fifth, and the live file ending with
// "the end"; it returns the log's path and its number of lines.
func tailLog(t *testing.T, size int) (string, int) {
	path := filepath.Join(t.TempDir(), "0.log")
	content := strings.Repeat("x", 80)
	var gz, plain, live strings.Builder
	for range 4000 {
		gz.WriteString(rec(0, Stdout, "F", content))
	}
	gz.WriteString(rec(0, Stdout, "F", "last of the gzipped file"))
	writeGz(t, path+".20260102-030405.gz", gz.String())
	for plain.Len() < size/5 {
		plain.WriteString(rec(1, Stdout, "F", content))
	}
	writeFile(t, path+".20260102-030406", plain.String())
	for live.Len() < size-size/5 {
		live.WriteString(rec(2, Stdout, "F", content))
	}
	live.WriteString(rec(3, Stderr, "F", "the end"))
	writeFile(t, path, live.String())
	return path, 4001 + strings.Count(plain.String(), "\n") + strings.Count(live.String(), "\n")
}

// A tail of more lines than the log has, of a 20 MiB log of which a
// rotated part is gzipped, holds no more than a few MiB whatever it asks
// for (a ring of lines held all 20).
func TestReadLogTailMemoryBounded(t *testing.T) {
	path, _ := tailLog(t, 20<<20)
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	out := &heapAtFirstWrite{}
	if err := ReadLog(context.Background(), path, out, ReadOptions{TailLines: math.MaxInt32, LimitBytes: 1}); err != nil {
		t.Fatal(err)
	}
	grew := int64(out.heap) - int64(before.HeapAlloc)
	t.Logf("heap at the first write: %d KiB more than before", grew>>10)
	if grew > 12<<20 {
		t.Errorf("the heap grew by %d MiB for a tail of a 20 MiB log", grew>>20)
	}
}

// A tail is exact wherever it falls: in the live file, at the start of a
// rotated one, within the gzipped one, past all there is.
func TestReadLogTailAcrossFiles(t *testing.T) {
	path, lines := tailLog(t, 1<<20)
	for _, n := range []int{1, 2, 4000, 4001, 4002, lines - 4001, lines - 4000, lines - 1, lines, lines + 1} {
		var b bytes.Buffer
		if err := ReadLog(context.Background(), path, &b, ReadOptions{TailLines: n}); err != nil {
			t.Fatal(err)
		}
		got := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
		want := min(n, lines)
		if len(got) != want || got[len(got)-1] != "the end" {
			t.Errorf("tail %d: %d lines ending %q, want %d ending \"the end\"", n, len(got), got[len(got)-1], want)
		}
		if n >= lines && got[0] != strings.Repeat("x", 80) || n == lines-4000 && got[0] != "last of the gzipped file" {
			t.Errorf("tail %d starts %q", n, got[0])
		}
	}
}
