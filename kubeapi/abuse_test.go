package kubeapi

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/noderun/noderun/internal/execio"
	"golang.org/x/net/websocket"
	v1 "k8s.io/api/core/v1"
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
	// Each command ends only once all the session's streams were answered:
	// a connection closed while a stream is still being created may drop
	// the status already sent on another (spdystream's client).
	var ran atomic.Int64
	var answered atomic.Pointer[chan struct{}]
	s.cfg.Exec = func(ctx context.Context, id string, cmd []string, e execio.ExecIO) (int, error) {
		ran.Add(1)
		select {
		case <-*answered.Load():
		case <-ctx.Done():
		}
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
		all := make(chan struct{})
		answered.Store(&all)
		var created sync.WaitGroup
		for _, typ := range []string{streamTypeError, streamTypeStdout, streamTypeStdout, streamTypeStderr} {
			h := http.Header{}
			h.Set(streamTypeHeader, typ)
			created.Add(1)
			go func() { // CreateStream waits for the reply: the streams race
				st, err := conn.CreateStream(h)
				created.Done()
				if err != nil {
					return
				}
				b, _ := io.ReadAll(st)
				if typ == streamTypeError {
					status <- string(b)
				}
			}()
		}
		go func() { created.Wait(); close(all) }()
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

// countingReader counts what was read from r.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// A terminal size message that never ends is not held: the sizes before it
// are passed on, and the rest of the stream is dropped as it comes.
func TestResizeMessagesBounded(t *testing.T) {
	const endless = 8 << 20
	src := &countingReader{r: io.MultiReader(strings.NewReader(`{"Width":80,"Height":24}{"Width":"`), strings.NewReader(strings.Repeat("9", endless)))}
	out := make(chan execio.TerminalSize, 10)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	readResizes(src, out, nil)
	runtime.ReadMemStats(&after)
	var got []execio.TerminalSize
	for sz := range out {
		got = append(got, sz)
	}
	if len(got) != 1 || got[0] != (execio.TerminalSize{Width: 80, Height: 24}) {
		t.Errorf("sizes %v, want [{80 24}]", got)
	}
	if src.n < endless {
		t.Errorf("read %d bytes of %d: the stream was not drained to its end", src.n, endless)
	}
	// Holding the message took 16 MiB (the decoder's buffer doubling).
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 2<<20 {
		t.Errorf("reading the message allocated %d KiB", alloc>>10)
	}
}

// rawSPDY upgrades a connection to the server's path to SPDY and returns
// it, for the test to write what it likes.
func rawSPDY(t *testing.T, srv *httptest.Server, path, protocol string) net.Conn {
	t.Helper()
	c, err := tls.Dial("tcp", srv.Listener.Addr().String(), srv.Client().Transport.(*http.Transport).TLSClientConfig)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: %s\r\n\r\n", path, protocol)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade %s: %v %v", path, resp, err)
	}
	return c
}

// spdyControl is a SPDY/3 control frame of type typ with payload, its
// length as declared (len(payload) unless given).
func spdyControl(typ uint16, payload []byte, declared ...int) []byte {
	n := len(payload)
	if len(declared) > 0 {
		n = declared[0]
	}
	return append([]byte{0x80, 3, byte(typ >> 8), byte(typ), 0, byte(n >> 16), byte(n >> 8), byte(n)}, payload...)
}

// Malformed sessions of exec, attach and port-forward, over SPDY and over
// WebSockets, end without leaving goroutines behind, and what they make
// the server hold is bounded by the libraries' frame limits.
func TestMalformedStreamSessions(t *testing.T) {
	s, _ := newTestStreams(t, streamPod())
	s.cfg.Exec = func(ctx context.Context, id string, cmd []string, e execio.ExecIO) (int, error) {
		if e.Stdin != nil {
			go io.Copy(io.Discard, e.Stdin)
		}
		<-ctx.Done()
		return 0, nil
	}
	s.cfg.DialPod = func(ctx context.Context, pod *v1.Pod, port int) (net.Conn, error) {
		return nil, errors.New("nothing listens")
	}
	srv := streamServer(t, s)
	const pod = "/api/v1/namespaces/default/pods/web/"
	rng := rand.New(rand.NewPCG(1, 2))
	garbage := make([]byte, 64<<10)
	for i := range garbage {
		garbage[i] = byte(rng.Uint32())
	}
	synStream := func(id byte, header []byte) []byte {
		return spdyControl(1, append([]byte{0, 0, 0, id, 0, 0, 0, 0, 0, 0}, header...))
	}
	spdyAbuse := map[string][]byte{
		"garbage": garbage,
		// A data frame declaring 16 MiB on a stream never opened.
		"huge data frame": append([]byte{0, 0, 0, 1, 0, 0xff, 0xff, 0xff}, garbage[:1024]...),
		// A control frame declaring 16 MiB, of which little comes.
		"huge control frame":    spdyControl(1, garbage[:1024], 0xffffff),
		"corrupt header block":  synStream(1, garbage[:200]),
		"unknown control frame": spdyControl(0x7fff, garbage[:100]),
		"nothing":               nil,
	}
	heapBefore := heapInUse()
	for _, path := range []struct{ path, protocol string }{
		{pod + "exec?command=sh&stdin=true&stdout=true&tty=true", remoteCommandV4},
		{pod + "attach?stdout=true", remoteCommandV4},
		{pod + "portforward", portForwardProtocol},
	} {
		for name, b := range spdyAbuse {
			c := rawSPDY(t, srv, path.path, path.protocol)
			c.SetWriteDeadline(time.Now().Add(30 * time.Second))
			if _, err := c.Write(b); err != nil {
				t.Logf("%s, %s: the server closed: %v", path.path, name, err)
			}
			c.Close()
		}
	}
	wsAbuse := map[string][][]byte{
		"empty frames":           {{}, {}, {}},
		"unknown channel":        {{9, 1, 2, 3}},
		"bad close signal":       {{255, 0, 1}},
		"close of no channel":    {{255, 42}},
		"resize garbage":         {append([]byte{4}, "{{{"...)},
		"endless resize":         {append([]byte{4}, `{"Width":"`+strings.Repeat("9", 64<<10)...)},
		"large stdin message":    {append([]byte{0}, garbage...)},
		"output channel written": {append([]byte{1}, garbage[:100]...), append([]byte{3}, garbage[:100]...)},
	}
	for name, frames := range wsAbuse {
		ws, err := dialWebSocket(srv, "exec?command=sh&stdin=true&stdout=true&tty=true", remoteCommandV5)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, f := range frames {
			if err := websocket.Message.Send(ws, f); err != nil {
				t.Logf("%s: the server closed: %v", name, err)
				break
			}
		}
		websocket.Message.Send(ws, "text, not binary")
		ws.Close()
	}
	for name, b := range map[string][]byte{"garbage": garbage, "huge data frame": spdyAbuse["huge data frame"]} {
		ws, err := dialWebSocket(srv, "portforward", portForwardTunnelProtocol)
		if err != nil {
			t.Fatalf("port-forward tunnel, %s: %v", name, err)
		}
		websocket.Message.Send(ws, b)
		ws.Close()
	}
	for _, fn := range []string{"kubeapi.(*StreamServer)", "kubeapi.(*forwarder)", "kubeapi.readResizes", "kubeapi.(*remoteStreams)"} {
		waitGoroutinesGone(t, fn)
	}
	srv.CloseClientConnections()
	waitGoroutinesGone(t, "net/http.(*conn).serve")
	if grew := heapInUse() - heapBefore; grew > 8<<20 {
		t.Errorf("the heap grew by %d MiB", grew>>20)
	}
}

// Many watches from one token: the cap holds, the refused ones cost
// nothing, and when the clients go every goroutine goes with them.
func TestManyWatches(t *testing.T) {
	s := New(testCreds)
	s.Ready(&fakeBackend{pods: []v1.Pod{testPod("default", "a")}}, nil)
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	before := runtime.NumGoroutine()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const n = 100
	codes := map[int]int{}
	var bodies []io.Closer
	for range n {
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/api/v1/pods?watch=true", nil)
		req.Header.Set("Authorization", "Bearer "+testCreds.ViewToken)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		codes[resp.StatusCode]++
		bodies = append(bodies, resp.Body)
	}
	if codes[http.StatusOK] != defaultCaps[watches] || codes[http.StatusTooManyRequests] != n-defaultCaps[watches] {
		t.Errorf("answers %v, want %d OK and the rest 429", codes, defaultCaps[watches])
	}
	t.Logf("goroutines: %d before, %d with %d watches open", before, runtime.NumGoroutine(), codes[http.StatusOK])
	cancel()
	for _, b := range bodies {
		b.Close()
	}
	waitGoroutinesGone(t, "kubeapi.(*resource[...]).serveWatch")
	srv.CloseClientConnections()
	waitGoroutinesGone(t, "net/http.(*conn).serve")
}
