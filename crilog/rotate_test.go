package crilog

import (
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

func TestTargetArg(t *testing.T) {
	r := Rotation{MaxSize: 10 << 20, MaxFiles: 5}
	for _, want := range []Target{
		{Path: "/var/log/pods/a_b_c/x/0.log", Rotation: r},
		{Path: "/plain/0.log"},
		{Path: "/var/log/pods/a_b_c/x/0.log", Rotation: r, Collector: "/run/noderun/log-collector.sock"},
		{Path: "/odd:name&x=1/0.log", Collector: "/run/noderun/log-collector.sock"},
		{Path: "/var/log/pods/a_b_c/x/0.log", Rotation: r, Collector: "/run/noderun/log-collector.sock", Root: "/var/log/pods"},
		{Path: "/var/log/pods/a_b_c/x/0.log", Rotation: r, Root: "/var/log/pods"},
		{Path: "/var/log/pods/a_b_c/x/0.log", Root: "/var/log/pods"},
	} {
		got, err := ParseArg(want.Arg())
		if err != nil || got != want {
			t.Errorf("round trip of %+v through %q: %+v %v", want, want.Arg(), got, err)
		}
	}
	for _, bad := range []string{"x:5:/p", "100:1:/p", "0:5:/p", "1:2",
		"collector=%2Fs&path=rel&max-size=0&max-files=0", "collector=rel&path=%2Fp&max-size=0&max-files=0",
		"collector=%2Fs&path=%2Fp&max-size=10&max-files=1", "collector=%2Fs&path=%2Fp",
		"collector=&path=%2Fp&max-size=0&max-files=0", "collector=&path=%2Fp%2F0.log&max-size=0&max-files=0&root=%2Fq",
		"collector=&path=%2Fp%2F0.log&max-size=0&max-files=0&root=p", "collector=&path=%2Fp&max-size=0&max-files=0&root=%2Fp"} {
		if _, err := ParseArg(bad); err == nil {
			t.Errorf("ParseArg(%q) accepted", bad)
		}
	}
}

// readLines reads a log file, gunzipping a .gz one.
func readLines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".gz") {
		zr, err := gzip.NewReader(f)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		r = zr
	}
	var out []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		_, _, _, content, err := ParseLine(sc.Text())
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, content)
	}
	return out
}

// The log is rotated at MaxSize with the kubelet's names: the newest
// rotated file stays plain, older ones are gzipped, MaxFiles are kept in
// all, and the lines they hold are the latest, whole and in order.
func TestServeRotates(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "0.log")
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- serve(Target{Path: path, Rotation: Rotation{MaxSize: 4096, MaxFiles: 3}}, outR, strings.NewReader(""), &closeRecorder{}, func(err error) { t.Error(err) })
	}()
	const n = 400
	for i := range n {
		fmt.Fprintf(outW, "line %d %s\n", i, strings.Repeat("x", 60))
	}
	outW.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var files []string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		files, _ = filepath.Glob(filepath.Join(dir, "0.log*"))
		gz := slices.ContainsFunc(files, func(f string) bool { return strings.HasSuffix(f, ".gz") })
		if len(files) == 3 && gz {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("files %v: want 0.log, a plain rotated file and a gzipped one", files)
		}
	}
	slices.SortFunc(files, func(a, b string) int { // oldest first, the current log last
		if a == path {
			return 1
		}
		if b == path {
			return -1
		}
		return strings.Compare(strings.TrimSuffix(a, ".gz"), strings.TrimSuffix(b, ".gz"))
	})
	if !strings.HasSuffix(files[0], ".gz") || strings.HasSuffix(files[1], ".gz") {
		t.Fatalf("files %v: the older rotated file should be gzipped, the newest plain", files)
	}
	var lines []string
	for _, f := range files {
		if f != path {
			if fi, _ := os.Stat(f); !strings.HasSuffix(f, ".gz") && fi.Size() < 4096 {
				t.Errorf("%s has %d bytes, rotated before MaxSize", f, fi.Size())
			}
		}
		lines = append(lines, readLines(t, f)...)
	}
	last := -1
	for _, l := range lines {
		i, err := strconv.Atoi(strings.Fields(l)[1])
		if err != nil || i != last+1 && last != -1 {
			t.Fatalf("line %q after %d: lines lost or out of order within what is kept", l, last)
		}
		last = i
	}
	if last != n-1 {
		t.Fatalf("the last line kept is %d, want %d", last, n-1)
	}
}

// A rotation names its file after the newest of its second, even when
// tidy has already removed the second's oldest: reusing the free name
// would sort the newest lines first, and tidy would then remove them.
func TestAsideNameFollowsTheNewest(t *testing.T) {
	const stamp = "20260101-000000"
	for _, tc := range []struct {
		name  string
		there []string
		want  string
	}{
		{"first of its second", nil, "0.log." + stamp},
		{"second", []string{"0.log." + stamp}, "0.log." + stamp + "-001"},
		{"after a gzipped one", []string{"0.log." + stamp + ".gz"}, "0.log." + stamp + "-001"},
		{"oldest removed", []string{"0.log." + stamp + "-001.gz", "0.log." + stamp + "-002"}, "0.log." + stamp + "-003"},
		{"compression under way", []string{"0.log." + stamp + "-004.gz.tmp"}, "0.log." + stamp + "-005"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, f := range append(tc.there, "0.log.20251231-235959") {
				if err := os.WriteFile(filepath.Join(dir, f), nil, 0o640); err != nil {
					t.Fatal(err)
				}
			}
			rt := &rotator{path: filepath.Join(dir, "0.log")}
			d, err := os.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			if got := rt.asideName(d, stamp); got != tc.want {
				t.Errorf("asideName = %s, want %s", got, tc.want)
			}
		})
	}
}

// A rotation whose new log cannot be made (no free inode, a quota) leaves
// the log under its name, says so once, and is tried again a little later
// until it works: moved aside for good, the log would grow without bound
// under a name no reader follows and no later rotation renames.
func TestRotationResumesAfterAFailedCreate(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "0.log")
	// The rotator's tidying goroutine reads the clock and may report too.
	var mu sync.Mutex
	var reports []string
	w := newRecordWriter(Target{Path: path, Rotation: Rotation{MaxSize: 4096, MaxFiles: 3}}, func(err error) {
		mu.Lock()
		defer mu.Unlock()
		reports = append(reports, err.Error())
	})
	var now atomic.Int64
	now.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()).UTC() }
	w.now, w.rot.now = clock, clock
	creates, failures := 0, 3
	w.rot.create = func(dir *os.File, name string) (*os.File, error) {
		if creates++; creates <= failures {
			return nil, syscall.ENOSPC
		}
		return createLog(dir, name)
	}
	if err := w.open(true); err != nil {
		t.Fatal(err)
	}
	defer w.close()
	line := []byte(strings.Repeat("x", 100))
	for range 200 { // well past MaxSize, all within one retry interval
		w.write(Stdout, tagFull, line)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatalf("the log is gone after a failed rotation: %v", err)
	}
	if fi.Size() < 200*100 {
		t.Errorf("the log has %d bytes: records went elsewhere", fi.Size())
	}
	if creates != 1 {
		t.Errorf("%d creates within one retry interval, want 1", creates)
	}
	for creates < failures+1 {
		now.Add(int64(rotateRetry))
		w.write(Stdout, tagFull, line)
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() != 0 {
		t.Fatalf("the log after the rotation worked: %v, %v; want a new empty log", fi, err)
	}
	w.write(Stdout, tagFull, line)
	rotated, _ := filepath.Glob(path + ".*")
	if len(rotated) != 1 {
		t.Fatalf("rotated files %v, want one", rotated)
	}
	if fi, err := os.Stat(rotated[0]); err != nil || fi.Size() < 200*100 {
		t.Errorf("the rotated file %v, %v: want all that was written before", fi, err)
	}
	want := []string{
		"crilog: rotate: no space left on device; the log grows past its maximum size until a rotation works",
		"crilog: rotating again",
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(reports, want) {
		t.Errorf("reports %q, want %q", reports, want)
	}
}

// An adopted stream's log is created at its first record when it is gone
// (a collector killed between a rotation's rename and create), but not its
// directory: the pod may have been removed meanwhile.
func TestAdoptedStreamCreatesItsLog(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "0.log")
	w := newRecordWriter(Target{Path: path}, func(err error) { t.Error(err) })
	w.write(Stdout, tagFull, []byte("adopted"))
	w.close()
	if lines := readLines(t, path); !slices.Equal(lines, []string{"adopted"}) {
		t.Errorf("log %q, want the adopted stream's record", lines)
	}

	gone := filepath.Join(dir, "removed-pod", "c", "0.log")
	var reports []error
	w = newRecordWriter(Target{Path: gone}, func(err error) { reports = append(reports, err) })
	w.write(Stdout, tagFull, []byte("dropped"))
	w.close()
	if _, err := os.Stat(filepath.Dir(gone)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the removed pod's log dir was made again: %v", err)
	}
	if len(reports) != 1 || !errors.Is(reports[0], fs.ErrNotExist) {
		t.Errorf("reports %v, want one saying the log's directory is gone", reports)
	}
}

// A rotation's tidying goroutine that reports after the writer is done
// (serve flushed its report queue on return) has its report dropped: sent
// on the closed queue, it panicked noderun's log driver (make test-loaded).
// The test holds tidy back until the flush, and makes it fail then.
func TestTidyReportAfterFlushIsDropped(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pod")
	path := filepath.Join(dir, "0.log")
	var mu sync.Mutex
	var reports []string
	send, flush := async(func(err error) {
		mu.Lock()
		defer mu.Unlock()
		reports = append(reports, err.Error())
	})
	w := newRecordWriter(Target{Path: path, Rotation: Rotation{MaxSize: 1024, MaxFiles: 3}}, send)
	tidied := make(chan struct{})
	w.rot.report = func(err error) {
		send(err)
		close(tidied) // tidy reports once at most here: its directory is gone
	}
	if err := w.open(true); err != nil {
		t.Fatal(err)
	}
	w.rot.gz.Lock() // tidy waits for it first
	for rotated := []string(nil); len(rotated) == 0; rotated, _ = filepath.Glob(path + ".*") {
		w.write(Stdout, tagFull, []byte(strings.Repeat("x", 100))) // until one rotation, one tidy
	}
	if err := w.close(); err != nil {
		t.Fatal(err)
	}
	flush()
	if err := os.RemoveAll(dir); err != nil { // tidy cannot open it: it reports
		t.Fatal(err)
	}
	w.rot.gz.Unlock()
	select {
	case <-tidied:
	case <-time.After(time.Minute): // only if tidy never runs
		t.Fatal("tidy did not report")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reports) != 0 {
		t.Errorf("reports %q after the flush, want none", reports)
	}
}
