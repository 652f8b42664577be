package crilog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"
)

// ErrNoCollector is returned by Holder.Streams while no collector is
// connected.
var ErrNoCollector = errors.New("crilog: no log collector connected")

// Holder is the second keeper of every container pipe the collector reads
// (it runs in the noderun daemon). It holds duplicates of the read ends, so
// that a collector killed outright leaves each pipe a reader: the container
// neither gets SIGPIPE nor loses what it writes, which waits in the pipe
// until the restarted collector takes the duplicates back. It also starts
// the collector whenever none answers.
type Holder struct {
	sock  string
	start func() error
	log   *slog.Logger

	mu   sync.Mutex
	held map[string]heldStream
	conn *net.UnixConn

	statsMu sync.Mutex // one stats question at a time
	stats   chan []StreamStats
}

type heldStream struct {
	m   message
	fds []int
}

// NewHolder returns a holder for the collector at sock; start starts a
// collector process (which exits at once when one already runs).
func NewHolder(sock string, start func() error, log *slog.Logger) *Holder {
	return &Holder{sock: sock, start: start, log: log, held: map[string]heldStream{}, stats: make(chan []StreamStats, 1)}
}

// Run keeps a collector running and connected until ctx ends. The held
// pipes stay open after it returns: a noderun that stops keeps them until
// it exits, and the collector keeps its own.
func (h *Holder) Run(ctx context.Context) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		conn, err := h.connect(ctx)
		if err != nil {
			h.log.Warn("log collector not reachable; retrying", "socket", h.sock, "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		h.session(ctx, conn)
		if ctx.Err() == nil {
			h.log.Warn("log collector connection lost; restarting it", "socket", h.sock)
		}
	}
}

// connect dials the collector, starting one if none answers.
func (h *Holder) connect(ctx context.Context) (*net.UnixConn, error) {
	if c, err := dialCollector(h.sock, time.Second); err == nil {
		return c, nil
	}
	if err := h.start(); err != nil {
		return nil, fmt.Errorf("start log collector: %w", err)
	}
	var last error
	for i := 0; i < 50 && ctx.Err() == nil; i++ {
		c, err := dialCollector(h.sock, time.Second)
		if err == nil {
			return c, nil
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	return nil, last
}

// session hands the collector what it holds, then keeps the pipes of every
// stream the collector reports until it reports its end.
func (h *Holder) session(ctx context.Context, conn *net.UnixConn) {
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	if err := sendMsg(conn, message{Op: opHold}); err != nil {
		return
	}
	h.mu.Lock()
	h.conn = conn
	var give []heldStream
	for _, s := range h.held {
		give = append(give, s)
	}
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		h.conn = nil
		h.mu.Unlock()
	}()
	// Sent from their own goroutine: the collector sends its streams at
	// the same time and a full socket must not stall both sides.
	go func() {
		for _, s := range give {
			if sendMsg(conn, s.m, s.fds...) != nil {
				return
			}
		}
	}()
	buf := make([]byte, maxMessage)
	for {
		m, fds, err := recvMsg(conn, buf)
		if err != nil {
			return
		}
		switch m.Op {
		case opStream:
			h.keep(m, fds)
		case opEnd:
			closeFDs(fds)
			h.release(m.Key)
		case opStats:
			closeFDs(fds)
			select {
			case h.stats <- m.Streams:
			default:
			}
		default:
			closeFDs(fds)
		}
	}
}

func (h *Holder) keep(m message, fds []int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.held[m.Key]; ok || len(fds) != 2 {
		closeFDs(fds)
		return
	}
	m.Op = opStream
	h.held[m.Key] = heldStream{m: m, fds: fds}
}

func (h *Holder) release(key string) {
	h.mu.Lock()
	s, ok := h.held[key]
	delete(h.held, key)
	h.mu.Unlock()
	if ok {
		closeFDs(s.fds)
	}
}

// Held is how many streams' pipes the holder keeps.
func (h *Holder) Held() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.held)
}

// Streams asks the collector for each open stream's dropped records.
func (h *Holder) Streams(ctx context.Context) ([]StreamStats, error) {
	h.statsMu.Lock()
	defer h.statsMu.Unlock()
	h.mu.Lock()
	conn := h.conn
	h.mu.Unlock()
	if conn == nil {
		return nil, ErrNoCollector
	}
	select { // an answer that came too late for an earlier question
	case <-h.stats:
	default:
	}
	if err := sendMsg(conn, message{Op: opStats}); err != nil {
		return nil, fmt.Errorf("crilog: ask the log collector: %w", err)
	}
	select {
	case s := <-h.stats:
		return s, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("crilog: the log collector did not answer: %w", ctx.Err())
	}
}
