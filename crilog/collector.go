package crilog

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// pipeSize is what the collector raises each container pipe to: the
// output a container can write while no collector reads (one is being
// restarted) before its writes block. Pipe capacity is accounted per user
// against fs.pipe-user-pages-soft (64 MiB by default) and every root pipe
// on the host shares that account, so it stays modest: 100 containers take
// 50 MiB of it.
const pipeSize = 256 << 10

// holderWriteTimeout bounds a write to the holder: a stopped noderun must
// not hold up a container's start. The holder is dropped and reconnects.
const holderWriteTimeout = 2 * time.Second

// Collector writes every container's output of the node to its CRI log:
// one process in place of one log driver process per container. A driver
// hands it the container's pipes (Handoff) and exits; a holder (the noderun
// daemon) keeps duplicates of every pipe, so that a collector killed and
// restarted takes them back and the container never meets a pipe without a
// reader.
type Collector struct {
	report   func(path string, err error)
	activity func()

	mu      sync.Mutex
	streams map[string]*stream
	holder  *net.UnixConn // nil while no holder is connected
	idle    chan struct{} // closed when no holder and no stream remain

	holderMu sync.Mutex // one write to the holder at a time
}

type stream struct {
	key   string
	w     *recordWriter
	files [2]*os.File // stdout, stderr read ends
	fds   [2]int      // the same, for passing on
	taps  taps        // attach sessions' raw copies (attach.go)
}

// idleStart is how long a collector that no holder ever reached waits:
// the noderun that started it may have stopped meanwhile.
const idleStart = time.Minute

// RunCollector runs the node's collector on the unix socket sock until ctx
// ends or it has nothing left to do: no holder connected and no stream
// open (the next noderun starts a new one). Only one runs per socket
// (a flock on sock + ".lock"); a second returns nil at once. report gets
// each failure with the log path it concerns; it is called from one
// goroutine of its own and must not block for long. activity is called
// after each change of streams or holder (to return memory once quiet).
func RunCollector(ctx context.Context, sock string, report func(path string, err error), activity func()) error {
	closeInherited()
	unlock, err := lockCollector(sock + ".lock")
	if err != nil || unlock == nil {
		return err
	}
	defer unlock()
	// A small heap: the collector's work is copying, its garbage buffers.
	debug.SetGCPercent(50)
	_ = os.Remove(sock)
	old := unix.Umask(0o077) // root only: whoever connects hands us pipes or takes them
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: sock, Net: "unixpacket"})
	unix.Umask(old)
	if err != nil {
		return fmt.Errorf("crilog: collector socket: %w", err)
	}
	send, flush := asyncReport(report)
	defer flush()
	c := &Collector{report: send, activity: activity, streams: map[string]*stream{}, idle: make(chan struct{})}
	time.AfterFunc(idleStart, func() {
		c.mu.Lock()
		c.checkIdle()
		c.mu.Unlock()
	})
	go func() {
		select {
		case <-ctx.Done():
		case <-c.idle:
		}
		l.Close()
	}()
	for {
		conn, err := l.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil || c.isIdle() {
				return nil
			}
			return fmt.Errorf("crilog: collector accept: %w", err)
		}
		go c.serveConn(conn)
	}
}

// lockCollector takes the single-instance lock, waiting a little for a
// collector that is exiting; nil, nil when another collector runs.
func lockCollector(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("crilog: collector lock: %w", err)
	}
	for i := 0; ; i++ {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("crilog: collector lock: %w", err)
		}
		if i == 20 {
			f.Close()
			return nil, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// asyncReport is async for reports about many logs: one goroutine for the
// whole collector, never holding up a copy.
func asyncReport(report func(string, error)) (send func(string, error), flush func()) {
	type pathErr struct {
		path string
		err  error
	}
	queue := make(chan pathErr, 32)
	var pending atomic.Int32 // queued or being sent
	go func() {
		for pe := range queue {
			report(pe.path, pe.err)
			pending.Add(-1)
		}
	}()
	send = func(path string, err error) {
		pending.Add(1)
		select {
		case queue <- pathErr{path, err}:
		default:
			pending.Add(-1)
		}
	}
	// The queue stays open: copies may still report while the process exits.
	flush = func() {
		for i := 0; i < 100 && pending.Load() > 0; i++ {
			time.Sleep(10 * time.Millisecond)
		}
	}
	return send, flush
}

func (c *Collector) isIdle() bool {
	select {
	case <-c.idle:
		return true
	default:
		return false
	}
}

// checkIdle ends the collector when nobody needs it; c.mu is held. It is
// called after each change, so it also notes activity.
func (c *Collector) checkIdle() {
	c.activity()
	if c.holder == nil && len(c.streams) == 0 && !c.isIdle() {
		close(c.idle)
	}
}

func (c *Collector) serveConn(conn *net.UnixConn) {
	defer conn.Close()
	buf := make([]byte, smallMessage)
	m, fds, err := recvMsg(conn, buf)
	if err != nil {
		return
	}
	switch m.Op {
	case opRegister:
		c.register(conn, m, fds)
	case opHold:
		closeFDs(fds)
		c.serveHolder(conn, buf)
	case opAttach:
		closeFDs(fds)
		c.serveAttach(conn, m.Key)
	default:
		closeFDs(fds)
	}
}

// register takes a new container's pipes from its driver: the log is
// created, the holder given its duplicates, and only then the driver told
// it may let go of them (until then it serves them itself if need be).
func (c *Collector) register(conn *net.UnixConn, m message, fds []int) {
	if len(fds) != 2 || m.Key == "" || m.Path == "" {
		closeFDs(fds)
		_ = sendMsg(conn, message{Op: opFail, Error: "crilog: register wants a key, a path and two pipes"})
		return
	}
	s, err := c.newStream(m, fds)
	if err != nil {
		closeFDs(fds)
		_ = sendMsg(conn, message{Op: opFail, Error: err.Error()})
		return
	}
	if err := s.w.open(true); err != nil {
		s.closeFiles()
		_ = sendMsg(conn, message{Op: opFail, Error: err.Error()})
		return
	}
	if !c.add(s, true) {
		s.w.close()
		s.closeFiles() // a retried registration: the first one holds them
	}
	_ = sendMsg(conn, message{Op: opAck})
}

func (c *Collector) newStream(m message, fds []int) (*stream, error) {
	s := &stream{key: m.Key, fds: [2]int{fds[0], fds[1]}}
	for i, fd := range fds {
		// Non-blocking, so the reads park in Go's poller, not in a thread.
		if err := unix.SetNonblock(fd, true); err != nil {
			return nil, fmt.Errorf("crilog: pipe of %s: %w", m.Key, err)
		}
		_, _ = unix.FcntlInt(uintptr(fd), unix.F_SETPIPE_SZ, pipeSize) // best effort: see pipeSize
		s.files[i] = os.NewFile(uintptr(fd), m.Key)
	}
	report := c.report
	s.w = newRecordWriter(Target{Path: m.Path, Rotation: m.Rotation, Root: m.Root}, func(err error) { report(m.Path, err) })
	return s, nil
}

func (s *stream) closeFiles() {
	for _, f := range s.files {
		f.Close()
	}
}

// add starts copying s unless its key is known; toHolder passes its pipes
// to the holder first.
func (c *Collector) add(s *stream, toHolder bool) bool {
	c.mu.Lock()
	if _, ok := c.streams[s.key]; ok {
		c.mu.Unlock()
		return false
	}
	c.streams[s.key] = s
	h := c.holder
	c.activity()
	c.mu.Unlock()
	if toHolder && h != nil {
		c.toHolder(h, s.message(opStream), s.fds[:]...)
	}
	var open atomic.Int32
	open.Store(2)
	for i, name := range []string{Stdout, Stderr} {
		go func() {
			if err := copyTapped(s.w, s.files[i], name, func(p []byte) { s.taps.send(i, p) }); err != nil {
				c.report(s.w.path, err)
			}
			s.taps.ended(i)
			if open.Add(-1) == 0 {
				c.end(s)
			}
		}()
	}
	return true
}

func (s *stream) message(op string) message {
	m := message{Op: op, Key: s.key, Path: s.w.path, Root: s.w.root}
	if s.w.rot != nil {
		m.Rotation = s.w.rot.r
	}
	return m
}

// end closes a stream whose pipes both reached EOF: its container ended
// and the shim closed the write ends.
func (c *Collector) end(s *stream) {
	if total, dropping := s.w.Dropped(); dropping {
		c.report(s.w.path, fmt.Errorf("crilog: output ended while writes failed; %d records dropped in all", total))
	}
	if err := s.w.close(); err != nil {
		c.report(s.w.path, err)
	}
	s.closeFiles()
	c.mu.Lock()
	delete(c.streams, s.key)
	h := c.holder
	c.checkIdle()
	c.mu.Unlock()
	if h != nil {
		c.toHolder(h, message{Op: opEnd, Key: s.key})
	}
}

func (c *Collector) toHolder(h *net.UnixConn, m message, fds ...int) {
	c.holderMu.Lock()
	defer c.holderMu.Unlock()
	_ = h.SetWriteDeadline(time.Now().Add(holderWriteTimeout))
	if err := sendMsg(h, m, fds...); err != nil {
		h.Close() // its reader sees the error and forgets the holder
	}
}

// serveHolder gives a newly connected holder every stream's pipes, takes
// the pipes it holds that this collector does not know (its predecessor's),
// and answers its questions until it goes.
func (c *Collector) serveHolder(conn *net.UnixConn, buf []byte) {
	c.mu.Lock()
	if c.holder != nil {
		c.holder.Close()
	}
	c.holder = conn
	streams := make([]*stream, 0, len(c.streams))
	for _, s := range c.streams {
		streams = append(streams, s)
	}
	c.mu.Unlock()
	for _, s := range streams {
		c.toHolder(conn, s.message(opStream), s.fds[:]...)
	}
	defer func() {
		c.mu.Lock()
		if c.holder == conn {
			c.holder = nil
		}
		c.checkIdle()
		c.mu.Unlock()
	}()
	for {
		m, fds, err := recvMsg(conn, buf)
		if err != nil {
			return
		}
		switch m.Op {
		case opStream:
			c.adopt(m, fds)
		case opStats:
			closeFDs(fds)
			c.toHolder(conn, message{Op: opStats, Streams: c.Stats()})
		default:
			closeFDs(fds)
		}
	}
}

// adopt takes back a stream from the holder. Its log is opened at its
// first record; one that already ended reads EOF at once and is closed.
func (c *Collector) adopt(m message, fds []int) {
	if len(fds) != 2 {
		closeFDs(fds)
		return
	}
	s, err := c.newStream(m, fds)
	if err != nil {
		closeFDs(fds)
		c.report(m.Path, err)
		return
	}
	if !c.add(s, false) {
		s.closeFiles()
	}
}

// Stats is each open stream's count of dropped records.
func (c *Collector) Stats() []StreamStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]StreamStats, 0, len(c.streams))
	for _, s := range c.streams {
		total, dropping := s.w.Dropped()
		out = append(out, StreamStats{Key: s.key, Path: s.w.path, Dropped: total, Dropping: dropping})
	}
	return out
}

// closeInherited closes the descriptors the collector inherited beyond
// stdio: whatever its starter left without close-on-exec (a pipe of the
// shell that started noderun, say) must not be held open by a process
// that outlives it. Everything Go opens is close-on-exec, so a descriptor
// without the flag was inherited.
func closeInherited() {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd < 3 {
			continue
		}
		if flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil && flags&unix.FD_CLOEXEC == 0 {
			unix.Close(fd)
		}
	}
}
