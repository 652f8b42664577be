package crilog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// An attach session (kubectl attach) sees a container's output as the
// container wrote it, as containerd's CRI tees it to attach clients: a
// terminal's prompt, which no log record holds until its line ends, shows
// at once. The collector sends an attach connection each chunk it reads
// from the container's pipes, as one packet: the pipe's index (0 stdout,
// 1 stderr) and the bytes; a packet of the index alone says that pipe
// ended.

// tapWriteTimeout bounds a write to an attach connection: an attach
// client that does not read is dropped rather than holding up the log.
const tapWriteTimeout = 5 * time.Second

// ErrNotCollected says the collector does not hold the container's
// output (none runs, or its log driver writes the log itself): the
// output is only in the log.
var ErrNotCollected = errors.New("crilog: the container's output is not in the collector")

// taps are the attach connections of one stream.
type taps struct {
	mu    sync.Mutex
	conns []*net.UnixConn
	eof   [2]bool
}

// add adds c once ack reached it, and tells it of the pipes that ended.
func (t *taps) add(c *net.UnixConn, ack func() error) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := ack(); err != nil {
		return err
	}
	for i, ended := range t.eof {
		if ended {
			if err := writeTap(c, i, nil); err != nil {
				return err
			}
		}
	}
	t.conns = append(t.conns, c)
	return nil
}

func (t *taps) remove(c *net.UnixConn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, x := range t.conns {
		if x == c {
			t.conns = append(t.conns[:i], t.conns[i+1:]...)
			return
		}
	}
}

// send copies p, read from pipe i, to every attach; one that cannot take
// it in time is closed.
func (t *taps) send(i int, p []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.conns) == 0 {
		return
	}
	kept := t.conns[:0]
	for _, c := range t.conns {
		if writeTap(c, i, p) != nil {
			c.Close()
			continue
		}
		kept = append(kept, c)
	}
	t.conns = kept
}

// ended tells every attach that pipe i reached EOF.
func (t *taps) ended(i int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.eof[i] = true
	for _, c := range t.conns {
		if writeTap(c, i, nil) != nil {
			c.Close()
		}
	}
}

func writeTap(c *net.UnixConn, i int, p []byte) error {
	_ = c.SetWriteDeadline(time.Now().Add(tapWriteTimeout))
	_, err := c.Write(append([]byte{byte(i)}, p...))
	return err
}

// serveAttach sends an attach connection the output of the stream of key
// until the connection closes.
func (c *Collector) serveAttach(conn *net.UnixConn, key string) {
	c.mu.Lock()
	s := c.streams[key]
	c.mu.Unlock()
	if s == nil {
		_ = sendMsg(conn, message{Op: opFail, Error: "no stream " + key})
		return
	}
	if err := s.taps.add(conn, func() error { return sendMsg(conn, message{Op: opAck}) }); err != nil {
		return
	}
	defer s.taps.remove(conn)
	// The attach sends nothing more: a read returns once it went.
	buf := make([]byte, 1)
	for {
		if _, err := conn.Read(buf); err != nil {
			return
		}
	}
}

// Attach writes the output of the container at key (<containerd
// namespace>/<container id>), as it comes from now on, from the collector
// at sock to stdout and stderr, until the output ends or ctx does. With
// stderr nil (a terminal's container, whose output is all stdout) it ends
// with stdout. ErrNotCollected: the output is only in the log.
func Attach(ctx context.Context, sock, key string, stdout, stderr io.Writer) error {
	conn, err := dialCollector(sock, time.Second)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNotCollected, err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	if err := sendMsg(conn, message{Op: opAttach, Key: key}); err != nil {
		return fmt.Errorf("crilog: attach: %w", err)
	}
	m, fds, err := recvMsg(conn, make([]byte, smallMessage))
	closeFDs(fds)
	switch {
	case err != nil:
		return fmt.Errorf("crilog: attach: %w", err)
	case m.Op == opFail:
		return fmt.Errorf("%w: %s", ErrNotCollected, m.Error)
	case m.Op != opAck:
		return fmt.Errorf("crilog: attach: the collector answered %q", m.Op)
	}
	return readTaps(ctx, conn, stdout, stderr)
}

// readTaps writes the packets of an attach connection to their streams
// until both pipes (stdout alone, with stderr nil) ended.
func readTaps(ctx context.Context, conn io.Reader, stdout, stderr io.Writer) error {
	out := []io.Writer{stdout, stderr}
	open := 2
	if stderr == nil {
		out[1], open = io.Discard, 1
	}
	buf := make([]byte, readSize+1)
	for open > 0 {
		n, err := conn.Read(buf)
		if n == 0 || err != nil {
			if ctx.Err() != nil {
				return nil // the client went
			}
			if err == nil {
				err = io.EOF
			}
			return fmt.Errorf("crilog: attach: the collector went: %w", err)
		}
		i := int(buf[0])
		if i > 1 {
			return fmt.Errorf("crilog: attach: packet for stream %d", i)
		}
		if n == 1 {
			if i == 0 || stderr != nil {
				open--
			}
			continue
		}
		if _, err := out[i].Write(buf[1:n]); err != nil {
			return err
		}
	}
	return nil
}
