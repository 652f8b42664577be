package kubeapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/streaming/pkg/httpstream"
	"k8s.io/streaming/pkg/httpstream/spdy"
	"k8s.io/streaming/pkg/httpstream/wsstream"

	"github.com/noderun/noderun/crilog"
	"github.com/noderun/noderun/internal/execio"
)

// The remote command subprotocols over SPDY, newest first. v4 carries the
// exit code as a Status; v3 adds terminal resizing to v2. v5, over a
// WebSocket only, adds closing one stream (the client's stdin).
const (
	remoteCommandV5 = "v5.channel.k8s.io"
	remoteCommandV4 = "v4.channel.k8s.io"
	remoteCommandV3 = "v3.channel.k8s.io"
	remoteCommandV2 = "v2.channel.k8s.io"
	remoteCommandV1 = "channel.k8s.io"
)

var remoteCommandProtocols = []string{remoteCommandV4, remoteCommandV3, remoteCommandV2, remoteCommandV1}

// Stream types a client names in the streamType header of each stream.
const (
	streamTypeHeader = "streamType"
	streamTypeStdin  = "stdin"
	streamTypeStdout = "stdout"
	streamTypeStderr = "stderr"
	streamTypeError  = "error"
	streamTypeResize = "resize"
)

// remoteOptions are the streams a client of exec or attach asks for, with
// the query parameters kubectl sends to the API server.
type remoteOptions struct {
	stdin, stdout, stderr, tty bool
}

func parseRemoteOptions(q url.Values) (remoteOptions, *metav1.Status) {
	var o remoteOptions
	for _, p := range []struct {
		name string
		v    *bool
	}{{"stdin", &o.stdin}, {"stdout", &o.stdout}, {"stderr", &o.stderr}, {"tty", &o.tty}} {
		if s := q.Get(p.name); s != "" {
			var err error
			if *p.v, err = strconv.ParseBool(s); err != nil {
				return o, badRequest(fmt.Sprintf("%s: invalid value %q: must be true or false", p.name, s))
			}
		}
	}
	if o.tty && o.stderr {
		o.stderr = false // a terminal carries both; the kubelet drops stderr too
	}
	// After the drop, as the kubelet checks: a terminal's stderr alone is
	// no stream.
	if !o.stdin && !o.stdout && !o.stderr {
		return o, badRequest("you must specify at least one of stdin, stdout, stderr")
	}
	return o, nil
}

// Exec serves pods/exec: a command run in a running container with the
// client's streams; its exit code reaches the client.
func (s *StreamServer) Exec(w http.ResponseWriter, r *http.Request, namespace, podName string) {
	q := r.URL.Query()
	cmd := q["command"]
	if len(cmd) == 0 {
		writeStatus(w, badRequest("you must specify at least one command for the container"))
		return
	}
	opts, serr := parseRemoteOptions(q)
	if serr != nil {
		writeStatus(w, serr)
		return
	}
	_, _, id, serr := s.runningContainer(namespace, podName, q.Get("container"), "exec into", func(name string) *metav1.Status {
		return badRequest(fmt.Sprintf("container %s is not running", name))
	})
	if serr != nil {
		writeStatus(w, serr)
		return
	}
	rs, ok := s.acceptRemote(w, r, opts)
	if !ok {
		return
	}
	ctx, cancel := rs.context(r.Context())
	defer cancel()
	code, err := s.cfg.Exec(ctx, id, cmd, execio.ExecIO{
		Stdin: rs.stdin, Stdout: rs.stdout, Stderr: rs.stderr,
		TTY: opts.tty, Resize: rs.resize,
	})
	if err != nil {
		err = fmt.Errorf("error executing command in container: %w", err)
	}
	rs.finish(code, err)
}

// Attach serves pods/attach as the kubelet and containerd's CRI do: the
// container's output from now on (read from its log, stdout and stderr
// apart, all stdout with a terminal) until it ends; with stdin asked for
// and the container's stdin open, the client's stdin goes to it (see the
// runtime's Attach) and the session ends with it, unless stdinOnce without
// a terminal closed the container's stdin, when the output goes on until
// the container ends. Whether there is a terminal is the container's tty,
// not the client's: a process's terminal cannot change once it runs.
func (s *StreamServer) Attach(w http.ResponseWriter, r *http.Request, namespace, podName string) {
	q := r.URL.Query()
	opts, serr := parseRemoteOptions(q)
	if serr != nil {
		writeStatus(w, serr)
		return
	}
	// The kubelet finds only running containers to attach to.
	pod, name, id, serr := s.runningContainer(namespace, podName, q.Get("container"), "attach to", func(name string) *metav1.Status {
		return status(http.StatusInternalServerError, metav1.StatusReasonInternalError, fmt.Sprintf("container not found (%q)", name))
	})
	if serr != nil {
		writeStatus(w, serr)
		return
	}
	c, st, _ := findContainer(pod, name)
	rs, ok := s.acceptRemote(w, r, opts)
	if !ok {
		return
	}
	ctx, cancel := rs.context(r.Context())
	defer cancel()
	output := make(chan error, 1)
	go func() { output <- s.attachOutput(ctx, pod, c, st.RestartCount, id, rs) }()
	var stdin io.Reader // the container's stdin, if both ends have one
	if c.Stdin && rs.stdin != nil {
		stdin = rs.stdin
	}
	var input chan error // nil: the session ends with the output only
	if (stdin != nil || c.TTY && rs.resize != nil) && s.cfg.Attach != nil {
		input = make(chan error, 1)
		go func() {
			input <- s.cfg.Attach(ctx, id, c.StdinOnce, execio.ExecIO{Stdin: stdin, TTY: c.TTY, Resize: rs.resize})
		}()
	}
	rs.finish(0, waitAttach(output, input, stdin != nil, c.StdinOnce && !c.TTY, cancel))
}

// attachOutput writes the output of container c's run id to the client
// from now on until it ends: as the container writes it, from the log
// collector, or else from its log.
func (s *StreamServer) attachOutput(ctx context.Context, pod *v1.Pod, c *v1.Container, restart int32, id string, rs *remoteStreams) error {
	stdout, stderr := writerOrDiscard(rs.stdout), writerOrDiscard(rs.stderr)
	if c.TTY {
		stderr = nil // a terminal's output is all stdout
	}
	if s.cfg.AttachOutput != nil {
		err := s.cfg.AttachOutput(ctx, id, stdout, stderr)
		if !errors.Is(err, crilog.ErrNotCollected) {
			return err
		}
	}
	if c.TTY {
		// A terminal's lines end in "\r\n", which the log keeps as a line
		// end only; the client's terminal is raw and needs both.
		stdout, stderr = &crlfWriter{w: stdout}, io.Discard
	}
	return crilog.ReadLog(ctx, s.logPath(pod, c.Name, restart), stdout, crilog.ReadOptions{
		Follow: true, Stderr: stderr, Ended: s.ended(ctx, pod.Namespace, pod.Name, c.Name, id),
		Polling: s.followPolls(pod.Namespace+"/"+pod.Name, c.Name), Root: s.cfg.PodLogDir,
	})
}

// waitAttach waits for the end of an attach session: its output, or the
// end of its stdin (withStdin) unless that closed the container's stdin
// (closesStdin), when the output goes on to the container's end.
func waitAttach(output, input <-chan error, withStdin, closesStdin bool, cancel func()) error {
	select {
	case err := <-output:
		return err
	case err := <-input:
		switch {
		case err != nil:
			cancel()
			<-output
			return err
		case !withStdin || closesStdin:
			return <-output
		}
		cancel()
		<-output
		return nil
	}
}

// crlfWriter writes each "\n" as "\r\n".
type crlfWriter struct{ w io.Writer }

func (c *crlfWriter) Write(p []byte) (int, error) {
	if _, err := c.w.Write(bytes.ReplaceAll(p, []byte("\n"), []byte("\r\n"))); err != nil {
		return 0, err
	}
	return len(p), nil
}

// remoteStreams are the client's streams of one exec or attach, over SPDY
// or a WebSocket. Streams the client did not ask for are nil.
type remoteStreams struct {
	protocol string
	stdin    io.Reader
	stdout   io.WriteCloser
	stderr   io.WriteCloser
	errors   io.WriteCloser // the status at the end
	resize   chan execio.TerminalSize
	// gone is closed when the client's connection ends: a hijacked
	// request's context outlives it.
	gone  chan struct{}
	close func() error
}

// acceptRemote upgrades the request and waits for the client's streams.
// On failure the client has its answer already.
func (s *StreamServer) acceptRemote(w http.ResponseWriter, r *http.Request, opts remoteOptions) (*remoteStreams, bool) {
	if isWebSocket(r) {
		return s.acceptWebSocket(w, r, opts)
	}
	return s.acceptSPDY(w, r, opts)
}

// spdyWanted says which streams a SPDY client of protocol opens for opts,
// and how many.
func spdyWanted(opts remoteOptions, protocol string) (wanted map[string]bool, want int) {
	// The streams the query asked for, each once: any other is reset, so
	// that a client cannot make the wait for them count a stream twice.
	wanted = map[string]bool{streamTypeError: true, streamTypeStdin: opts.stdin, streamTypeStdout: opts.stdout,
		streamTypeStderr: opts.stderr, streamTypeResize: opts.tty && protocol != remoteCommandV2 && protocol != remoteCommandV1}
	for _, w := range wanted {
		if w {
			want++
		}
	}
	return wanted, want
}

// spdyArrival is a stream a SPDY client opened, with the signal that its
// reply went out.
type spdyArrival struct {
	stream    httpstream.Stream
	replySent <-chan struct{}
}

// acceptSPDY is acceptRemote for a SPDY client.
func (s *StreamServer) acceptSPDY(w http.ResponseWriter, r *http.Request, opts remoteOptions) (*remoteStreams, bool) {
	protocol, err := httpstream.Handshake(r, w, remoteCommandProtocols)
	if err != nil {
		return nil, false // Handshake answered
	}
	arrivals := make(chan spdyArrival)
	done := make(chan struct{})
	defer close(done)
	conn := spdy.NewResponseUpgrader().UpgradeResponse(w, r, func(st httpstream.Stream, replySent <-chan struct{}) error {
		select {
		case arrivals <- spdyArrival{st, replySent}:
			return nil
		case <-done:
			return errors.New("unexpected stream")
		}
	})
	if conn == nil {
		return nil, false // the upgrader answered
	}
	conn.SetIdleTimeout(streamIdleTimeout)
	rs := &remoteStreams{protocol: protocol, gone: make(chan struct{}), close: conn.Close}
	go func() {
		<-conn.CloseChan()
		close(rs.gone)
	}()
	if !s.acceptSPDYStreams(r, conn, rs, opts, arrivals, done) {
		return nil, false
	}
	return rs, true
}

// acceptSPDYStreams waits until the client opened the streams opts asks
// for, each into rs, and their replies went out. On failure it closes
// conn. done closes once nobody receives from arrivals any more.
func (s *StreamServer) acceptSPDYStreams(r *http.Request, conn httpstream.Connection, rs *remoteStreams, opts remoteOptions, arrivals <-chan spdyArrival, done <-chan struct{}) bool {
	wanted, want := spdyWanted(opts, rs.protocol)
	replied := make(chan struct{})
	expired := time.NewTimer(streamCreationTimeout)
	defer expired.Stop()
	for got := 0; got < want; {
		select {
		case a := <-arrivals:
			typ := a.stream.Headers().Get(streamTypeHeader)
			if !wanted[typ] {
				a.stream.Reset()
				continue
			}
			wanted[typ] = false
			switch typ {
			case streamTypeError:
				rs.errors = a.stream
			case streamTypeStdin:
				rs.stdin = a.stream
			case streamTypeStdout:
				rs.stdout = a.stream
			case streamTypeStderr:
				rs.stderr = a.stream
			case streamTypeResize:
				rs.resize = make(chan execio.TerminalSize)
				go readResizes(a.stream, rs.resize, rs.gone)
			}
			go func() {
				// done: the wait below has ended (or given up), and
				// nobody receives any more.
				select {
				case <-a.replySent:
					select {
					case replied <- struct{}{}:
					case <-done:
					}
				case <-done:
				}
			}()
		case <-replied:
			got++
		case <-expired.C:
			s.cfg.Log.Warn("streaming client did not open its streams", "path", r.URL.Path, "timeout", streamCreationTimeout)
			conn.Close()
			return false
		case <-rs.gone: // the client went (or broke the protocol) first
			conn.Close()
			return false
		}
	}
	return true
}

// The channels of the WebSocket protocol, in their order on the wire.
const (
	wsStdin = iota
	wsStdout
	wsStderr
	wsError
	wsResize
)

// acceptWebSocket opens the channels of v5.channel.k8s.io, which kubectl
// tries before SPDY. A client that does not offer v5 is refused and falls
// back to SPDY.
func (s *StreamServer) acceptWebSocket(w http.ResponseWriter, r *http.Request, opts remoteOptions) (*remoteStreams, bool) {
	channel := func(use bool, t wsstream.ChannelType) wsstream.ChannelType {
		if use {
			return t
		}
		return wsstream.IgnoreChannel
	}
	conn := wsstream.NewConn(map[string]wsstream.ChannelProtocolConfig{
		remoteCommandV5: {Binary: true, Channels: []wsstream.ChannelType{
			wsStdin:  channel(opts.stdin, wsstream.ReadChannel),
			wsStdout: channel(opts.stdout, wsstream.WriteChannel),
			wsStderr: channel(opts.stderr, wsstream.WriteChannel),
			wsError:  wsstream.WriteChannel,
			// Always read: its end is how the client's leaving shows.
			wsResize: wsstream.ReadChannel,
		}},
	})
	conn.SetIdleTimeout(streamIdleTimeout)
	protocol, ch, err := conn.Open(w, r)
	if err != nil {
		s.cfg.Log.Info("websocket upgrade failed", "path", r.URL.Path, "err", err)
		return nil, false
	}
	rs := &remoteStreams{protocol: protocol, errors: ch[wsError], gone: make(chan struct{}), close: conn.Close}
	if opts.stdin {
		rs.stdin = ch[wsStdin]
	}
	if opts.stdout {
		rs.stdout = ch[wsStdout]
	}
	if opts.stderr {
		rs.stderr = ch[wsStderr]
	}
	if opts.tty {
		rs.resize = make(chan execio.TerminalSize)
	}
	go func() {
		readResizes(ch[wsResize], rs.resize, nil)
		close(rs.gone)
	}()
	// As the kubelet does: an empty message tells the client the
	// channels are open.
	first := ch[wsError]
	if opts.stdout {
		first = ch[wsStdout]
	} else if opts.stderr {
		first = ch[wsStderr]
	}
	first.Write(nil)
	return rs, true
}

// context is ctx ended also when the client goes.
func (rs *remoteStreams) context(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-rs.gone:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// maxResizeMessage bounds one terminal size message (about 30 bytes):
// a JSON decoder holds a value of any length until it ends.
const maxResizeMessage = 4 << 10

// readResizes passes on the terminal sizes the client sends as JSON until
// the stream ends or breaks the protocol; with out nil it only waits for
// that end.
func readResizes(st io.Reader, out chan<- execio.TerminalSize, gone <-chan struct{}) {
	if out != nil {
		defer close(out)
	}
	in := &budgetReader{r: st}
	dec := json.NewDecoder(in)
	for {
		var sz execio.TerminalSize
		in.left = maxResizeMessage
		if err := dec.Decode(&sz); err != nil {
			if errors.Is(err, errOverBudget) {
				// The client's end of a WebSocket is not seen any more:
				// drop what it sends until it goes.
				io.Copy(io.Discard, st)
			}
			return
		}
		if out == nil {
			continue
		}
		select {
		case out <- sz:
		case <-gone:
			return
		}
	}
}

// errOverBudget: a message longer than its budget.
var errOverBudget = errors.New("message too long")

// budgetReader reads at most left bytes, then fails.
type budgetReader struct {
	r    io.Reader
	left int
}

func (b *budgetReader) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, errOverBudget
	}
	if len(p) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= n
	return n, err
}

// finish ends the output streams and tells the client how the command
// ended: v4 as a Status that carries a non-zero exit code, older
// protocols as text on failure only.
func (rs *remoteStreams) finish(code int, err error) {
	for _, st := range []io.WriteCloser{rs.stdout, rs.stderr} {
		if st != nil {
			st.Close()
		}
	}
	status := metav1.Status{Status: metav1.StatusSuccess}
	switch {
	case err != nil:
		status = metav1.Status{Status: metav1.StatusFailure, Reason: metav1.StatusReasonInternalError,
			Code: http.StatusInternalServerError, Message: fmt.Sprintf("Internal error occurred: %v", err)}
	case code != 0:
		status = metav1.Status{Status: metav1.StatusFailure, Reason: "NonZeroExitCode",
			Message: fmt.Sprintf("command terminated with non-zero exit code: exit status %d", code),
			Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{Type: "ExitCode", Message: strconv.Itoa(code)}}}}
	}
	if rs.errors == nil { // a client that sent no error stream hears nothing
		rs.close()
		return
	}
	if rs.protocol == remoteCommandV4 || rs.protocol == remoteCommandV5 {
		b, _ := json.Marshal(&status)
		rs.errors.Write(b)
	} else if status.Status != metav1.StatusSuccess {
		io.WriteString(rs.errors, status.Message)
	}
	rs.errors.Close()
	rs.close()
}

// writerOrDiscard is w, or where to drop what the client did not ask for.
func writerOrDiscard(w io.WriteCloser) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

// isWebSocket tells a WebSocket upgrade, which kubectl tries first.
func isWebSocket(r *http.Request) bool {
	return httpstream.IsUpgradeRequest(r) && strings.EqualFold(r.Header.Get("Upgrade"), "websocket")
}
