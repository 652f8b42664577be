package kubeapi

import (
	"context"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// goroutinesIn counts the goroutines whose stack holds fn.
func goroutinesIn(fn string) (n int, example string) {
	buf := make([]byte, 16<<20)
	stacks := string(buf[:runtime.Stack(buf, true)])
	for _, g := range strings.Split(stacks, "\n\n") {
		if strings.Contains(g, fn) {
			n++
			example = g
		}
	}
	return n, example
}

// waitGoroutinesGone fails unless every goroutine in fn ends within a
// generous while: tear-down after a client leaves takes a moment on a busy
// machine, a leak takes for ever.
func waitGoroutinesGone(t *testing.T, fn string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		n, example := goroutinesIn(fn)
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines still in %s, e.g.:\n%s", n, fn, example)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A SPDY client that opens streams its query did not ask for (a second
// stdout, a stderr) has them reset, and leaves nothing behind when it goes.
func TestSPDYExtraStreamsRefusedAndNothingLeaks(t *testing.T) {
	s, _ := newTestStreams(t, streamPod())
	var ran atomic.Int64
	s.cfg.Exec = func(ctx context.Context, id string, cmd []string, e ExecIO) (int, error) {
		ran.Add(1)
		return 0, nil
	}
	srv := streamServer(t, s)
	url := srv.URL + "/api/v1/namespaces/default/pods/web/exec?command=true&stdout=true"
	tlsCfg := srv.Client().Transport.(*http.Transport).TLSClientConfig
	const sessions = 30
	for range sessions {
		conn, err := dialSPDY(context.Background(), url, tlsCfg, "t", remoteCommandV4)
		if err != nil {
			t.Fatal(err)
		}
		status := make(chan string, 1)
		for _, typ := range []string{streamTypeError, streamTypeStdout, streamTypeStdout, streamTypeStderr} {
			h := http.Header{}
			h.Set(streamTypeHeader, typ)
			go func() { // CreateStream waits for the reply: the streams race
				st, err := conn.CreateStream(h)
				if err != nil {
					return
				}
				b, _ := io.ReadAll(st)
				if typ == streamTypeError {
					status <- string(b)
				}
			}()
		}
		select {
		case st := <-status:
			if err := statusResult([]byte(st)); err != nil {
				t.Fatalf("status %q: %v", st, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("no status from the exec")
		}
		conn.Close()
	}
	if ran.Load() != sessions {
		t.Errorf("%d commands ran, want %d", ran.Load(), sessions)
	}
	waitGoroutinesGone(t, "kubeapi.(*StreamServer).acceptSPDY")
}
