package kubeapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/noderun/noderun/internal/execio"
	"github.com/noderun/noderun/internal/testenv"
	"golang.org/x/net/websocket"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/streaming/pkg/httpstream"
	"k8s.io/streaming/pkg/httpstream/spdy"
)

// streamPod is a running pod with one container, run 2 of it, and its
// log dir.
func streamPod() v1.Pod {
	return v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "uid-1"},
		Spec:       v1.PodSpec{Containers: []v1.Container{{Name: "app"}}},
		Status: v1.PodStatus{Phase: v1.PodRunning, ContainerStatuses: []v1.ContainerStatus{{
			Name: "app", ContainerID: "containerd://run2", RestartCount: 2,
			State:                v1.ContainerState{Running: &v1.ContainerStateRunning{}},
			LastTerminationState: v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ContainerID: "containerd://run1", ExitCode: 1}},
		}}},
	}
}

// streamServer serves s's endpoints over TLS the way the API routes them.
func streamServer(t *testing.T, s *StreamServer) *httptest.Server {
	mux := http.NewServeMux()
	for sub, h := range map[string]func(http.ResponseWriter, *http.Request, string, string){
		"log": s.Log, "exec": s.Exec, "attach": s.Attach, "portforward": s.PortForward,
	} {
		mux.HandleFunc("/api/v1/namespaces/{ns}/pods/{name}/"+sub, func(w http.ResponseWriter, r *http.Request) {
			h(w, r, r.PathValue("ns"), r.PathValue("name"))
		})
	}
	srv := httptest.NewTLSServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func newTestStreams(t *testing.T, pods ...v1.Pod) (*StreamServer, string) {
	dir := t.TempDir()
	s := NewStreamServer(StreamConfig{
		Pods:      func() []v1.Pod { return pods },
		Changes:   func() (uint64, <-chan struct{}) { return 0, nil }, // nothing changes
		PodLogDir: dir,
		Log:       slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	return s, dir
}

func TestExecOverSPDY(t *testing.T) {
	s, _ := newTestStreams(t, streamPod())
	var gotID string
	var gotCmd []string
	s.cfg.Exec = func(ctx context.Context, id string, cmd []string, e execio.ExecIO) (int, error) {
		gotID, gotCmd = id, cmd
		in, _ := io.ReadAll(e.Stdin)
		fmt.Fprintf(e.Stdout, "read %q", in)
		io.WriteString(e.Stderr, "to stderr")
		return 7, nil
	}
	srv := streamServer(t, s)
	base := srv.URL + "/api/v1/namespaces/default/pods/web/exec?"
	var out, errOut bytes.Buffer
	err := RemoteCommand(context.Background(), base+"command=sh&command=-c&command=exit+7&stdin=true&stdout=true&stderr=true",
		srv.Client().Transport.(*http.Transport).TLSClientConfig, "token",
		execio.ExecIO{Stdin: strings.NewReader("hello"), Stdout: &out, Stderr: &errOut})
	var exit *ExitError
	if !errors.As(err, &exit) || exit.Code != 7 {
		t.Fatalf("err = %v, want exit code 7", err)
	}
	if gotID != "run2" || strings.Join(gotCmd, " ") != "sh -c exit 7" {
		t.Errorf("ran %q in %q, want \"sh -c exit 7\" in run2", gotCmd, gotID)
	}
	if out.String() != `read "hello"` || errOut.String() != "to stderr" {
		t.Errorf("stdout %q, stderr %q", out.String(), errOut.String())
	}

	// A runtime failure reaches the client as one.
	s.cfg.Exec = func(context.Context, string, []string, execio.ExecIO) (int, error) {
		return 0, errors.New("no such binary")
	}
	err = RemoteCommand(context.Background(), base+"command=nope&stdout=true", srv.Client().Transport.(*http.Transport).TLSClientConfig, "t", execio.ExecIO{Stdout: io.Discard})
	if err == nil || !strings.Contains(err.Error(), "no such binary") || errors.As(err, &exit) {
		t.Errorf("err = %v, want the runtime's error", err)
	}
}

func TestStreamRequestErrors(t *testing.T) {
	stopped := streamPod()
	stopped.Name = "stopped"
	stopped.Status.ContainerStatuses[0].State = v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}
	two := streamPod()
	two.Name = "two"
	two.Spec.Containers = append(two.Spec.Containers, v1.Container{Name: "side"})
	s, _ := newTestStreams(t, streamPod(), stopped, two)
	srv := streamServer(t, s)
	tests := []struct {
		path string
		code int
		want string
	}{
		{"missing/exec?command=ls&stdout=true", 404, `pods \"missing\" not found`},
		{"web/exec?stdout=true", 400, "at least one command"},
		{"web/exec?command=ls", 400, "at least one of stdin, stdout, stderr"},
		{"web/exec?command=ls&tty=true&stderr=true", 400, "at least one of stdin, stdout, stderr"},
		{"web/exec?command=ls&stdout=true&container=nope", 400, "container nope is not valid for pod web"},
		{"stopped/exec?command=ls&stdout=true", 400, "container app is not running"},
		{"two/exec?command=ls&stdout=true", 400, "a container name must be specified for pod two, choose one of: [app side]"},
		{"stopped/attach?stdin=true&stdout=true", 500, `container not found (\"app\")`},
		{"web/log?tailLines=-1", 400, "tailLines"},
		{"web/log?limitBytes=0", 400, "limitBytes"},
		{"web/log?sinceSeconds=1&sinceTime=2026-01-01T00:00:00Z", 400, "at most one of"},
		{"web/log?follow=maybe", 400, "follow"},
		{"web/log?previous=true&container=side", 400, "not valid"},
		// Exec without a SPDY upgrade: the handshake refuses it.
		{"web/exec?command=ls&stdout=true", 400, "unable to upgrade"},
	}
	for _, tt := range tests {
		resp, err := srv.Client().Post(srv.URL+"/api/v1/namespaces/default/pods/"+tt.path, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tt.code || !strings.Contains(string(body), tt.want) {
			t.Errorf("%s: %d %s; want %d with %q", tt.path, resp.StatusCode, body, tt.code, tt.want)
		}
	}
	// A WebSocket that offers neither v5 exec nor the SPDY tunnel is
	// refused, so that kubectl falls back to SPDY.
	for _, sub := range []string{"exec?command=ls&stdout=true", "portforward"} {
		if ws, err := dialWebSocket(srv, sub, "v4.channel.k8s.io"); err == nil {
			ws.Close()
			t.Errorf("%s: a WebSocket with v4.channel.k8s.io was accepted", sub)
		}
	}
}

func dialWebSocket(srv *httptest.Server, sub, protocol string) (*websocket.Conn, error) {
	cfg, err := websocket.NewConfig(strings.Replace(srv.URL, "https", "wss", 1)+"/api/v1/namespaces/default/pods/web/"+sub, srv.URL)
	if err != nil {
		return nil, err
	}
	cfg.Protocol = []string{protocol}
	cfg.TlsConfig = srv.Client().Transport.(*http.Transport).TLSClientConfig
	return websocket.DialConfig(cfg)
}

func TestLogs(t *testing.T) {
	crash := streamPod()
	crash.Name = "crash"
	crash.Status.ContainerStatuses[0].State = v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}
	crash.Status.ContainerStatuses[0].LastTerminationState.Terminated.ContainerID = "containerd://run2"
	fresh := streamPod()
	fresh.Name = "fresh"
	fresh.Status.ContainerStatuses[0] = v1.ContainerStatus{Name: "app", State: v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: "ErrImagePull"}}}
	s, dir := newTestStreams(t, streamPod(), crash, fresh)
	for _, p := range []string{"web", "crash"} {
		d := filepath.Join(dir, "default_"+p+"_uid-1", "app")
		os.MkdirAll(d, 0o755)
		os.WriteFile(filepath.Join(d, "1.log"), []byte("2026-01-02T03:04:05Z stdout F run one\n"), 0o644)
		os.WriteFile(filepath.Join(d, "2.log"), []byte("2026-01-02T03:04:06Z stdout F run two\n2026-01-02T03:04:07Z stderr F more\n"), 0o644)
	}
	srv := streamServer(t, s)
	tests := []struct {
		query string
		code  int
		want  string
	}{
		{"web/log", 200, "run two\nmore\n"},
		{"web/log?previous=true", 200, "run one\n"},
		{"web/log?previous=1", 200, "run one\n"},
		// A follow of a run that ended ends once it is read.
		{"web/log?previous=true&follow=true", 200, "run one\n"},
		{"crash/log?follow=true", 200, "run two\nmore\n"},
		{"web/log?tailLines=1&timestamps=true", 200, "2026-01-02T03:04:07Z more\n"},
		{"web/log?limitBytes=4", 200, "run "},
		{"web/log?sinceTime=2026-01-02T03:04:07Z", 200, "more\n"},
		// Waiting to restart: both show the run that ended last.
		{"crash/log", 200, "run two\nmore\n"},
		{"crash/log?previous=true", 200, "run two\nmore\n"},
		{"fresh/log", 400, `container \"app\" in pod \"fresh\" is waiting to start: ErrImagePull`},
		{"fresh/log?previous=true", 400, `previous terminated container \"app\" in pod \"fresh\" not found`},
	}
	for _, tt := range tests {
		resp, err := srv.Client().Get(srv.URL + "/api/v1/namespaces/default/pods/" + tt.query)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tt.code || (tt.code == 200 && string(body) != tt.want) || !strings.Contains(string(body), tt.want) {
			t.Errorf("%s: %d %q; want %d %q", tt.query, resp.StatusCode, body, tt.code, tt.want)
		}
	}
}

// A port-forward carries each of the client's connections to the pod's
// port, a failure to connect as text on the error stream.
func TestPortForwardOverSPDY(t *testing.T) {
	s, _ := newTestStreams(t, streamPod())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				b, _ := io.ReadAll(c) // to the client's end
				fmt.Fprintf(c, "echo %s", b)
				c.Close()
			}()
		}
	}()
	s.cfg.DialPod = func(ctx context.Context, pod *v1.Pod, port int) (net.Conn, error) {
		if port != 8080 || pod.Name != "web" {
			return nil, fmt.Errorf("nothing listens on %d", port)
		}
		return net.Dial("tcp", ln.Addr().String())
	}
	srv := streamServer(t, s)
	t.Run("SPDY", func(t *testing.T) {
		conn, err := dialSPDY(context.Background(), srv.URL+"/api/v1/namespaces/default/pods/web/portforward",
			srv.Client().Transport.(*http.Transport).TLSClientConfig, "t", portForwardProtocol)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		checkForwards(t, conn)
	})
	// kubectl's default: SPDY inside a WebSocket's binary messages.
	t.Run("SPDY in a WebSocket", func(t *testing.T) {
		ws, err := dialWebSocket(srv, "portforward", portForwardTunnelProtocol)
		if err != nil {
			t.Fatal(err)
		}
		ws.PayloadType = websocket.BinaryFrame
		conn, err := spdy.NewClientConnection(ws)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		checkForwards(t, conn)
	})
}

// checkForwards forwards connections through a port-forward session.
func checkForwards(t *testing.T, conn httpstream.Connection) {
	forward := func(id, port string, send string) (data, errs string) {
		h := http.Header{}
		h.Set(streamTypeHeader, streamTypeError)
		h.Set(portHeader, port)
		h.Set(requestIDHeader, id)
		errStream, err := conn.CreateStream(h)
		if err != nil {
			t.Fatal(err)
		}
		errStream.Close()
		h.Set(streamTypeHeader, streamTypeData)
		dataStream, err := conn.CreateStream(h)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(dataStream, send)
		dataStream.Close()
		done := make(chan []byte)
		go func() {
			b, _ := io.ReadAll(errStream)
			done <- b
		}()
		d, _ := io.ReadAll(dataStream)
		select {
		case e := <-done:
			return string(d), string(e)
		case <-time.After(20 * time.Second):
			t.Fatal("the error stream never ended")
		}
		return
	}
	for _, id := range []string{"0", "1"} { // two connections over one session
		if d, e := forward(id, "8080", "ping "+id); d != "echo ping "+id || e != "" {
			t.Errorf("request %s: data %q, error %q", id, d, e)
		}
	}
	if d, e := forward("2", "9", "x"); d != "" || !strings.Contains(e, "nothing listens on 9") {
		t.Errorf("closed port: data %q, error %q", d, e)
	}
}

// kubectl tries exec over a WebSocket first (v5.channel.k8s.io): stdin
// with its close signal, stdout, stderr and the exit code as a Status.
func TestExecOverWebSocket(t *testing.T) {
	s, _ := newTestStreams(t, streamPod())
	s.cfg.Exec = func(ctx context.Context, id string, cmd []string, e execio.ExecIO) (int, error) {
		in, _ := io.ReadAll(e.Stdin) // ends with the client's close signal
		fmt.Fprintf(e.Stdout, "read %q", in)
		io.WriteString(e.Stderr, "to stderr")
		return 7, nil
	}
	srv := streamServer(t, s)
	ws, err := dialWebSocket(srv, "exec?command=cat&stdin=true&stdout=true&stderr=true", "v5.channel.k8s.io")
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	for _, frame := range [][]byte{append([]byte{0}, "hello"...), {255, 0}} {
		if err := websocket.Message.Send(ws, frame); err != nil {
			t.Fatal(err)
		}
	}
	got := map[byte]string{}
	for {
		var frame []byte
		if err := websocket.Message.Receive(ws, &frame); err != nil {
			break // the server closes after the status
		}
		if len(frame) > 0 {
			got[frame[0]] += string(frame[1:])
		}
	}
	if got[1] != `read "hello"` || got[2] != "to stderr" {
		t.Errorf("stdout %q, stderr %q", got[1], got[2])
	}
	var exit *ExitError
	if err := statusResult([]byte(got[3])); !errors.As(err, &exit) || exit.Code != 7 {
		t.Errorf("status %q: %v, want exit code 7", got[3], err)
	}
}

// Attach streams the container's output from now on, stdout and stderr
// apart, and ends when the container does.
func TestAttach(t *testing.T) {
	pod := streamPod()
	var mu sync.Mutex
	changed := make(chan struct{})
	s, dir := newTestStreams(t)
	s.cfg.Pods = func() []v1.Pod {
		mu.Lock()
		defer mu.Unlock()
		return []v1.Pod{*pod.DeepCopy()}
	}
	s.cfg.Changes = func() (uint64, <-chan struct{}) { return 0, changed }
	logDir := filepath.Join(dir, "default_web_uid-1", "app")
	os.MkdirAll(logDir, 0o755)
	logFile := filepath.Join(logDir, "2.log")
	os.WriteFile(logFile, []byte("2026-01-02T03:04:05Z stdout F before\n"), 0o644)
	srv := streamServer(t, s)

	out, errOut := &lockedBuffer{}, &lockedBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- RemoteCommand(context.Background(), srv.URL+"/api/v1/namespaces/default/pods/web/attach?stdout=true&stderr=true",
			srv.Client().Transport.(*http.Transport).TLSClientConfig, "t", execio.ExecIO{Stdout: out, Stderr: errOut})
	}()
	appendLog := func(s string) {
		f, _ := os.OpenFile(logFile, os.O_APPEND|os.O_WRONLY, 0)
		f.WriteString(s)
		f.Close()
	}
	// Lines written before the attach took hold are not shown: ping
	// until one is.
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(out.String(), "ping") {
		if time.Now().After(deadline) {
			t.Fatal("attach shows nothing")
		}
		appendLog("2026-01-02T03:04:06Z stdout F ping\n")
		time.Sleep(50 * time.Millisecond)
	}
	appendLog("2026-01-02T03:04:06Z stdout F after\n2026-01-02T03:04:07Z stderr F oops\n")
	for !strings.Contains(errOut.String(), "oops") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	pod.Status.ContainerStatuses[0].State = v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: 0}}
	mu.Unlock()
	close(changed)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("attach did not end with the container")
	}
	if o := out.String(); strings.Contains(o, "before") || !strings.HasSuffix(o, "ping\nafter\n") || errOut.String() != "oops\n" {
		t.Errorf("stdout %q, stderr %q; want pings then \"after\\n\", \"oops\\n\"", o, errOut.String())
	}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// With a terminal, kubectl's sizes reach the command's terminal and stderr
// is not a stream of its own.
func TestExecTerminalOverWebSocket(t *testing.T) {
	s, _ := newTestStreams(t, streamPod())
	got := make(chan []execio.TerminalSize, 1)
	s.cfg.Exec = func(ctx context.Context, id string, cmd []string, e execio.ExecIO) (int, error) {
		if !e.TTY || e.Stderr != nil || e.Resize == nil {
			return 1, fmt.Errorf("tty %t, stderr %v, resize %v", e.TTY, e.Stderr, e.Resize)
		}
		var sizes []execio.TerminalSize
		for sz := range e.Resize {
			if sizes = append(sizes, sz); len(sizes) == 2 {
				break
			}
		}
		got <- sizes
		return 0, nil
	}
	srv := streamServer(t, s)
	ws, err := dialWebSocket(srv, "exec?command=sh&stdin=true&stdout=true&stderr=true&tty=true", "v5.channel.k8s.io")
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	for _, sz := range []string{`{"Width":80,"Height":24}`, `{"Width":120,"Height":40}`} {
		if err := websocket.Message.Send(ws, append([]byte{4}, sz...)); err != nil {
			t.Fatal(err)
		}
	}
	var status string
	for {
		var frame []byte
		if err := websocket.Message.Receive(ws, &frame); err != nil {
			break
		}
		if len(frame) > 0 && frame[0] == 3 {
			status += string(frame[1:])
		}
	}
	if err := statusResult([]byte(status)); err != nil {
		t.Fatalf("status %q: %v", status, err)
	}
	want := []execio.TerminalSize{{Width: 80, Height: 24}, {Width: 120, Height: 40}}
	if sizes := <-got; len(sizes) != 2 || sizes[0] != want[0] || sizes[1] != want[1] {
		t.Errorf("sizes %v, want %v", sizes, want)
	}
}

// An attach session ends with its output, or with its stdin unless that
// closed the container's stdin (stdinOnce without a terminal): then the
// output goes on to the container's end.
func TestWaitAttach(t *testing.T) {
	boom := errors.New("boom")
	tests := []struct {
		name                   string
		outputFirst            bool
		inputErr               error
		withStdin, closesStdin bool
		wantCancel             bool
		wantErr                error
	}{
		{name: "output ends", outputFirst: true, withStdin: true},
		{name: "stdin ends", withStdin: true, wantCancel: true},
		{name: "stdin ends, stdinOnce", withStdin: true, closesStdin: true},
		{name: "resizes only", withStdin: false},
		{name: "stdin fails", withStdin: true, inputErr: boom, wantCancel: true, wantErr: boom},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			output, input := make(chan error, 1), make(chan error, 1)
			cancelled := false
			cancel := func() {
				cancelled = true
				output <- nil // the output follow ends with its context
			}
			if tc.outputFirst {
				output <- nil
			} else {
				input <- tc.inputErr
				if !tc.wantCancel {
					output <- nil // the container ended
				}
			}
			err := waitAttach(output, input, tc.withStdin, tc.closesStdin, cancel)
			if !errors.Is(err, tc.wantErr) || cancelled != tc.wantCancel {
				t.Errorf("err %v cancelled %v, want %v %v", err, cancelled, tc.wantErr, tc.wantCancel)
			}
		})
	}
}

// A terminal's output reaches the client with "\r\n" line ends, which the
// log keeps as line ends only.
func TestCRLFWriter(t *testing.T) {
	var b bytes.Buffer
	w := &crlfWriter{w: &b}
	if n, err := io.WriteString(w, "a\nb\n"); n != 4 || err != nil || b.String() != "a\r\nb\r\n" {
		t.Errorf("wrote %d %v: %q", n, err, b.String())
	}
}

// Attach passes the client's stdin and the container's stdinOnce and tty
// to the runtime; with a terminal the session ends with the client's stdin.
func TestAttachStdin(t *testing.T) {
	pod := streamPod()
	pod.Spec.Containers[0].Stdin, pod.Spec.Containers[0].StdinOnce, pod.Spec.Containers[0].TTY = true, true, true
	s, _ := newTestStreams(t, pod)
	// The output side follows the run's log until the session ends: with
	// no log it would fail at once, racing the stdin under test.
	testenv.WriteFile(t, s.logPath(&pod, "app", 2), "")
	type call struct {
		id        string
		stdinOnce bool
		tty       bool
		in        string
	}
	calls := make(chan call, 1)
	s.cfg.Attach = func(ctx context.Context, id string, stdinOnce bool, e execio.ExecIO) error {
		in, _ := io.ReadAll(e.Stdin)
		calls <- call{id, stdinOnce, e.TTY, string(in)}
		return nil
	}
	srv := streamServer(t, s)
	sizes := make(chan execio.TerminalSize)
	close(sizes)
	err := RemoteCommand(context.Background(), srv.URL+"/api/v1/namespaces/default/pods/web/attach?stdin=true&stdout=true&tty=true",
		srv.Client().Transport.(*http.Transport).TLSClientConfig, "t", execio.ExecIO{Stdin: strings.NewReader("typed"), Stdout: io.Discard, TTY: true, Resize: sizes})
	if err != nil {
		t.Fatal(err)
	}
	if c := <-calls; c != (call{"run2", true, true, "typed"}) {
		t.Errorf("runtime's Attach got %+v", c)
	}
}
