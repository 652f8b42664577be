package kubeapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"golang.org/x/net/websocket"

	v1 "k8s.io/api/core/v1"
	"k8s.io/streaming/pkg/httpstream"
	"k8s.io/streaming/pkg/httpstream/spdy"
)

// The port-forward subprotocol over SPDY and its stream headers: each
// forwarded connection is a pair of streams, data and error, with the
// same requestID.
const (
	portForwardProtocol = "portforward.k8s.io"
	// portForwardTunnelProtocol is the WebSocket subprotocol of SPDY
	// tunnelled through a WebSocket (kubectl's default since 1.31).
	portForwardTunnelProtocol = "SPDY/3.1+" + portForwardProtocol
	portHeader                = "port"
	requestIDHeader           = "requestID"
	streamTypeData            = "data"
	// portForwardLinger is how long the client's side of a forwarded
	// connection may take to end after the pod's has (containerd CRI's
	// wait).
	portForwardLinger = time.Second
)

// PortForward serves pods/portforward: each connection kubectl accepts
// is carried to 127.0.0.1:port (or ::1) inside the pod's network
// namespace, or the host's for a hostNetwork pod.
func (s *StreamServer) PortForward(w http.ResponseWriter, r *http.Request, namespace, podName string) {
	pod, serr := s.pod(namespace, podName)
	if serr != nil {
		writeStatus(w, serr)
		return
	}
	if pod.Status.Phase != v1.PodRunning {
		writeStatus(w, badRequest(fmt.Sprintf("unable to forward port because pod is not running. Current status=%v", pod.Status.Phase)))
		return
	}
	if isWebSocket(r) {
		s.portForwardTunnel(w, r, pod)
		return
	}
	if _, err := httpstream.Handshake(r, w, []string{portForwardProtocol}); err != nil {
		return // Handshake answered
	}
	f := s.newForwarder(pod)
	defer f.end()
	conn := spdy.NewResponseUpgrader().UpgradeResponse(w, r, f.received)
	if conn == nil {
		return // the upgrader answered
	}
	f.run(r.Context(), conn)
}

// portForwardTunnel serves kubectl's default port-forward: SPDY carried in
// the binary messages of a WebSocket whose subprotocol names it. A client
// that does not offer it is refused (403) and falls back to plain SPDY.
func (s *StreamServer) portForwardTunnel(w http.ResponseWriter, r *http.Request, pod *v1.Pod) {
	websocket.Server{
		Handshake: func(cfg *websocket.Config, _ *http.Request) error {
			if !slices.Contains(cfg.Protocol, portForwardTunnelProtocol) {
				return fmt.Errorf("websocket subprotocol %q not offered", portForwardTunnelProtocol)
			}
			cfg.Protocol = []string{portForwardTunnelProtocol}
			return nil
		},
		Handler: func(ws *websocket.Conn) {
			ws.PayloadType = websocket.BinaryFrame
			f := s.newForwarder(pod)
			defer f.end()
			conn, err := spdy.NewServerConnection(ws, f.received)
			if err != nil {
				s.cfg.Log.Info("port-forward tunnel", "pod", pod.Namespace+"/"+pod.Name, "err", err)
				return
			}
			f.run(r.Context(), conn)
		},
	}.ServeHTTP(w, r)
}

// checkPortStream refuses a stream without a valid port and type.
func checkPortStream(st httpstream.Stream) error {
	port, err := strconv.ParseUint(st.Headers().Get(portHeader), 10, 16)
	if err != nil || port == 0 {
		return fmt.Errorf("%q header must be a port from 1 to 65535, not %q", portHeader, st.Headers().Get(portHeader))
	}
	if t := st.Headers().Get(streamTypeHeader); t != streamTypeError && t != streamTypeData {
		return fmt.Errorf("invalid stream type %q", t)
	}
	return nil
}

// forwarder pairs a port-forward connection's streams and forwards each
// complete pair.
type forwarder struct {
	s       *StreamServer
	pod     *v1.Pod
	conn    httpstream.Connection
	streams chan httpstream.Stream
	done    chan struct{} // closed when the session ends
	mu      sync.Mutex
	pairs   map[string]*streamPair
}

func (s *StreamServer) newForwarder(pod *v1.Pod) *forwarder {
	return &forwarder{s: s, pod: pod, streams: make(chan httpstream.Stream, 1), done: make(chan struct{}), pairs: map[string]*streamPair{}}
}

// received is the connection's callback for each stream the client opens.
func (f *forwarder) received(st httpstream.Stream, _ <-chan struct{}) error {
	if err := checkPortStream(st); err != nil {
		return err
	}
	select {
	case f.streams <- st:
		return nil
	case <-f.done:
		return errors.New("port forwarding has ended")
	}
}

// run forwards the session's connections until the client closes it.
func (f *forwarder) run(ctx context.Context, conn httpstream.Connection) {
	f.conn = conn
	defer conn.Close()
	conn.SetIdleTimeout(streamIdleTimeout)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for {
		select {
		case <-conn.CloseChan():
			return
		case st := <-f.streams:
			f.add(ctx, st)
		}
	}
}

func (f *forwarder) end() { close(f.done) }

// streamPair is one forwarded connection's streams.
type streamPair struct {
	data, errors httpstream.Stream
	complete     chan struct{}
}

// add files st with its pair, forwarding once both are there; a pair
// left incomplete is given up after streamCreationTimeout.
func (f *forwarder) add(ctx context.Context, st httpstream.Stream) {
	id := st.Headers().Get(requestIDHeader)
	if id == "" {
		// Clients before requestID: the data stream follows its error
		// stream, stream IDs going up by 2.
		n := int(st.Identifier())
		if st.Headers().Get(streamTypeHeader) == streamTypeData {
			n -= 2
		}
		id = strconv.Itoa(n)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	p := f.pairs[id]
	if p == nil {
		p = &streamPair{complete: make(chan struct{})}
		f.pairs[id] = p
		go f.expire(id, p)
	}
	slot := &p.errors
	if st.Headers().Get(streamTypeHeader) == streamTypeData {
		slot = &p.data
	}
	if *slot != nil {
		fmt.Fprintf(st, "request %s: a second %s stream", id, st.Headers().Get(streamTypeHeader))
		st.Reset()
		return
	}
	*slot = st
	if p.data != nil && p.errors != nil {
		close(p.complete)
		go f.forward(ctx, p)
	}
}

func (f *forwarder) expire(id string, p *streamPair) {
	t := time.NewTimer(streamCreationTimeout)
	defer t.Stop()
	select {
	case <-p.complete:
	case <-t.C:
		f.mu.Lock()
		if p.errors != nil {
			fmt.Fprintf(p.errors, "request %s: timed out waiting for the data stream", id)
		}
		for _, st := range []httpstream.Stream{p.data, p.errors} {
			if st != nil {
				st.Reset()
			}
		}
		f.mu.Unlock()
	case <-f.conn.CloseChan():
	}
	f.mu.Lock()
	delete(f.pairs, id)
	f.mu.Unlock()
}

// forward copies between the data stream and a connection to the port in
// the pod; a failure to connect goes to the error stream, as kubectl
// shows it.
func (f *forwarder) forward(ctx context.Context, p *streamPair) {
	defer f.conn.RemoveStreams(p.data, p.errors)
	defer p.errors.Close()
	defer p.data.Close()
	port, _ := strconv.Atoi(p.data.Headers().Get(portHeader))
	conn, err := f.s.cfg.DialPod(ctx, f.pod, port)
	if err != nil {
		fmt.Fprintf(p.errors, "error forwarding port %d to pod %s: %v", port, f.pod.Name, err)
		return
	}
	defer conn.Close()
	toClient, toPod := make(chan struct{}), make(chan struct{})
	go func() {
		io.Copy(p.data, conn)
		close(toClient)
	}()
	go func() {
		io.Copy(conn, p.data)
		// The client's end is passed on; the pod's answer still comes.
		if cw, ok := conn.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
		close(toPod)
	}()
	select {
	case <-toClient:
	case <-ctx.Done():
		return
	}
	// The pod closed: what the client still sends has a moment to go.
	t := time.NewTimer(portForwardLinger)
	defer t.Stop()
	select {
	case <-toPod:
	case <-t.C:
	case <-ctx.Done():
	}
}
