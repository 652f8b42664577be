package crilog

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// An attach gets a stream's output as written, an unfinished line too,
// stdout and stderr apart, and ends once both pipes did; the log has the
// same output as records. A key the collector does not hold is
// ErrNotCollected.
func TestCollectorAttach(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "c.sock")
	ctx, cancel := context.WithCancel(context.Background())
	collected := make(chan struct{})
	defer func() { cancel(); <-collected }()
	go func() {
		defer close(collected)
		RunCollector(ctx, sock, func(string, error) {}, func() {})
	}()
	outR, outW := mustPipe(t)
	errR, errW := mustPipe(t)
	target := Target{Path: filepath.Join(dir, "logs", "0.log"), Collector: sock}
	if err := Handoff(target, "ns/c1", int(outR.Fd()), int(errR.Fd()), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	outR.Close()
	errR.Close()

	if err := Attach(ctx, sock, "ns/other", io.Discard, io.Discard); !errors.Is(err, ErrNotCollected) {
		t.Errorf("attach to an unknown key: %v, want ErrNotCollected", err)
	}
	stdout, stderr := &syncBuffer{}, &syncBuffer{}
	attached := make(chan error, 1)
	go func() { attached <- Attach(ctx, sock, "ns/c1", stdout, stderr) }()
	// Written until the attach shows it: it sees what comes once it took hold.
	waitFor(t, "the attach to show output", func() bool {
		io.WriteString(outW, "ping\n")
		return strings.Contains(stdout.String(), "ping\n")
	})
	io.WriteString(outW, "/ # ")
	io.WriteString(errW, "oops\n")
	waitFor(t, "the prompt and stderr", func() bool {
		return strings.HasSuffix(stdout.String(), "/ # ") && stderr.String() == "oops\n"
	})
	outW.Close()
	select {
	case err := <-attached:
		t.Fatalf("attach ended with stdout alone: %v", err)
	default:
	}
	errW.Close()
	select {
	case err := <-attached:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("attach did not end with the pipes")
	}
	waitFor(t, "the prompt's record in the log", func() bool {
		b, _ := os.ReadFile(target.Path)
		return strings.Contains(string(b), " stdout P / # \n")
	})
}
