package crilog

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"github.com/noderun/noderun/internal/testenv"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// collectorProcs starts collectors as child processes of the test binary,
// as noderun starts them, and kills them at the end of the test.
type collectorProcs struct {
	t    *testing.T
	sock string
	mu   sync.Mutex
	cmds []*exec.Cmd
}

func (p *collectorProcs) start() error {
	cmd := exec.Command(os.Args[0], "-test.run=^TestCollectorSurvivesKill$")
	cmd.Env = append(os.Environ(), "CRILOG_COLLECTOR="+p.sock)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	p.mu.Lock()
	p.cmds = append(p.cmds, cmd)
	p.mu.Unlock()
	go cmd.Wait()
	p.t.Cleanup(func() { cmd.Process.Kill() })
	return nil
}

func (p *collectorProcs) last() *exec.Cmd {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmds[len(p.cmds)-1]
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// A collector killed with SIGKILL loses nothing and never leaves the
// container a pipe without a reader: the holder keeps duplicates, starts
// a new collector and hands them over; what the container wrote meanwhile
// waits in the pipe.
func TestCollectorSurvivesKill(t *testing.T) {
	testenv.SkipIfEmulated(t, runsItself)
	if sock := os.Getenv("CRILOG_COLLECTOR"); sock != "" {
		err := RunCollector(context.Background(), sock, func(path string, err error) { fmt.Fprintln(os.Stderr, path, err) }, func() {})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	dir := t.TempDir()
	procs := &collectorProcs{t: t, sock: filepath.Join(dir, "c.sock")}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h := NewHolder(procs.sock, procs.start, slog.New(slog.DiscardHandler))
	go h.Run(ctx)

	path := filepath.Join(dir, "pod", "0.log")
	outR, outW := mustPipe(t)
	errR, errW := mustPipe(t)
	target := Target{Path: path, Rotation: Rotation{MaxSize: 512 << 10, MaxFiles: 10} /* rotates, keeps all */, Collector: procs.sock}
	if err := Handoff(target, "ns/c1", int(outR.Fd()), int(errR.Fd()), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	outR.Close() // as the driver exits
	errR.Close()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("log not created before the handoff returned: %v", err)
	}
	if n, err := unix.FcntlInt(outW.Fd(), unix.F_GETPIPE_SZ, 0); err != nil || n < pipeSize {
		t.Errorf("pipe size %d (%v), want at least %d", n, err, pipeSize)
	}
	waitFor(t, "the holder to keep the pipes", func() bool { return h.Held() == 1 })

	write := func(from, to int) {
		for i := from; i < to; i++ {
			if _, err := fmt.Fprintf(outW, "line %d\n", i); err != nil {
				t.Fatalf("write line %d: %v", i, err) // EPIPE: no reader was left
			}
		}
	}
	write(0, 1000)
	waitFor(t, "the first lines in the log", func() bool { return hasLines(path, 0, 1000) })
	first := procs.last()
	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	write(1000, 60000) // 700 KB, more than a pipe holds: it blocks until a new collector reads
	outW.Close()
	errW.Close()
	waitFor(t, "every line in the log", func() bool { return hasLines(path, 0, 60000) })
	if procs.last() == first {
		t.Fatal("no new collector was started")
	}
	waitFor(t, "the holder to let the ended stream go", func() bool { return h.Held() == 0 })
}

// hasLines says whether the log and its rotated files hold every
// "line N" for from <= N < to, each exactly once.
func hasLines(path string, from, to int) bool {
	files, _ := filepath.Glob(path + "*")
	seen := map[string]int{}
	for _, f := range files {
		if strings.HasSuffix(f, ".gz") || strings.HasSuffix(f, ".tmp") {
			data, err := readMaybeGzip(f)
			if err != nil {
				return false
			}
			countLines(seen, data)
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			return false
		}
		countLines(seen, string(data))
	}
	for i := from; i < to; i++ {
		if seen[fmt.Sprintf("line %d", i)] != 1 {
			return false
		}
	}
	return true
}

func countLines(seen map[string]int, data string) {
	for _, l := range strings.Split(data, "\n") {
		if _, _, _, content, err := ParseLine(l); err == nil {
			seen[content]++
		}
	}
}

// A log that cannot be written drops the records, counts them, tells the
// holder's questions so, and never blocks the container.
func TestCollectorCountsDrops(t *testing.T) {
	// The full disk is in place before the collector runs and until it has
	// returned: it swaps a package variable the collector reads.
	full := fullDisk(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "c.sock")
	ctx, cancel := context.WithCancel(context.Background())
	collected := make(chan struct{})
	defer func() { cancel(); <-collected }()
	reports := make(chan string, 16)
	go func() {
		defer close(collected)
		RunCollector(ctx, sock, func(path string, err error) {
			select {
			case reports <- path + ": " + err.Error():
			default:
			}
		}, func() {})
	}()
	h := NewHolder(sock, func() error { return nil }, slog.New(slog.DiscardHandler))
	go h.Run(ctx)
	outR, outW := mustPipe(t)
	errR, errW := mustPipe(t)
	full.Collector = sock
	if err := Handoff(full, "ns/full", int(outR.Fd()), int(errR.Fd()), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	outR.Close()
	errR.Close()
	defer errW.Close()
	for i := 0; i < 5000; i++ { // many pipes' worth: a blocked copy would stop this
		if _, err := fmt.Fprintf(outW, "line %d\n", i); err != nil {
			t.Fatal(err)
		}
	}
	var got []StreamStats
	waitFor(t, "5000 dropped records", func() bool {
		s, err := h.Streams(ctx)
		if err != nil && !errors.Is(err, ErrNoCollector) {
			t.Fatal(err)
		}
		got = s
		return len(s) == 1 && s[0].Dropped == 5000
	})
	if s := got[0]; s.Key != "ns/full" || s.Path != full.Path || !s.Dropping {
		t.Errorf("stats %+v", s)
	}
	select {
	case r := <-reports:
		if !strings.Contains(r, full.Path+": crilog: write: ") {
			t.Errorf("report %q", r)
		}
	case <-time.After(30 * time.Second):
		t.Error("the failure was not reported")
	}
	outW.Close()
}

func readMaybeGzip(p string) (string, error) {
	if strings.HasSuffix(p, ".tmp") {
		return "", nil // a compression under way; its source is still there
	}
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return "", err
	}
	b, err := io.ReadAll(zr)
	return string(b), err
}

// A collector exits once its holder is gone and no stream is left, so it
// never outlives the node's last container and noderun.
func TestCollectorExitsWhenIdle(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "c.sock")
	done := make(chan error, 1)
	go func() { done <- RunCollector(context.Background(), sock, func(string, error) {}, func() {}) }()
	ctx, cancel := context.WithCancel(context.Background())
	h := NewHolder(sock, func() error { return nil }, slog.New(slog.DiscardHandler))
	go h.Run(ctx)
	waitFor(t, "the holder to connect", func() bool {
		_, err := h.Streams(ctx)
		return err == nil
	})
	select {
	case err := <-done:
		t.Fatalf("the collector ended with its holder connected: %v", err)
	default:
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the collector did not exit after its holder left")
	}
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left behind: %v", err)
	}
}
