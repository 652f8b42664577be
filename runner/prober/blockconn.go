package prober

import (
	"context"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// blockConn is a probe's TCP connection made with blocking system calls
// on a socket the netpoller never sees: the kernel's SO_SNDTIMEO and
// SO_RCVTIMEO carry the probe's deadline. A probe is one short exchange,
// and through the netpoller it costs an epoll_ctl add and delete, a
// nonblocking connect finished by getsockopt(SO_ERROR), an EAGAIN read and
// the wake-ups between the poller and the goroutine, which together cost
// more than the exchange itself. Errors are worded as package net words
// them, since they end up in probe messages.
type blockConn struct {
	fd       int
	deadline time.Time
	raddr    *net.TCPAddr
	stop     func() bool // undoes the context.AfterFunc that shuts fd down

	mu     sync.Mutex // fd may be shut down from another goroutine until closed
	closed bool
}

// blockSlots bounds the probes in blocking calls at once: each holds an
// OS thread while it waits, and a pod that never answers holds it for
// the whole timeout. Probes beyond it go through the netpoller.
var blockSlots = make(chan struct{}, 32)

// dialBlocking connects to ap by the deadline, or until ctx is done (the
// worker stopped), which shuts the socket down and so ends any call
// blocked on it. ok is false when no slot is free; the caller dials
// another way.
func dialBlocking(ctx context.Context, ap netip.AddrPort, deadline time.Time) (_ *blockConn, ok bool, err error) {
	select {
	case blockSlots <- struct{}{}:
	default:
		return nil, false, nil
	}
	c := &blockConn{fd: -1, deadline: deadline, raddr: net.TCPAddrFromAddrPort(ap)}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	family, sa := unix.AF_INET, unix.Sockaddr(&unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()})
	if ap.Addr().Is6() {
		family, sa = unix.AF_INET6, &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, true, c.dialError(os.NewSyscallError("socket", err))
	}
	c.fd = fd
	c.stop = context.AfterFunc(ctx, c.shutdown)
	for _, opt := range []int{unix.SO_SNDTIMEO, unix.SO_RCVTIMEO} {
		if err := c.setTimeout(opt); err != nil {
			return nil, true, c.dialError(err)
		}
	}
	for {
		if ctx.Err() != nil {
			// Shut down already, or about to be: a connect now would
			// start afresh.
			return nil, true, c.dialError(context.Cause(ctx))
		}
		err = unix.Connect(fd, sa)
		switch err {
		case nil, unix.EISCONN:
			return c, true, nil
		case unix.EINTR, unix.EINPROGRESS, unix.EALREADY:
			// Interrupted or timed out: a blocking connect waits on
			// where it was when called again.
			if err := c.setTimeout(unix.SO_SNDTIMEO); err != nil {
				return nil, true, c.dialError(err)
			}
			continue
		}
		return nil, true, c.dialError(os.NewSyscallError("connect", err))
	}
}

// setTimeout sets the socket's send or receive timeout to what is left
// until the deadline; os.ErrDeadlineExceeded once none is.
func (c *blockConn) setTimeout(opt int) error {
	left := time.Until(c.deadline)
	if left <= 0 {
		return os.ErrDeadlineExceeded
	}
	// A zero timeval would mean no timeout at all.
	tv := unix.NsecToTimeval(max(left, time.Microsecond).Nanoseconds())
	return os.NewSyscallError("setsockopt", unix.SetsockoptTimeval(c.fd, unix.SOL_SOCKET, opt, &tv))
}

func (c *blockConn) Read(p []byte) (int, error) {
	for {
		n, err := unix.Read(c.fd, p)
		switch {
		case err == nil && n == 0 && len(p) > 0:
			return 0, io.EOF
		case err == nil:
			return n, nil
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			// The kernel's timer may end a little before the deadline.
			if err := c.setTimeout(unix.SO_RCVTIMEO); err != nil {
				return 0, c.ioError("read", err)
			}
			continue
		}
		return 0, c.ioError("read", os.NewSyscallError("read", err))
	}
}

func (c *blockConn) Write(p []byte) (int, error) {
	done := 0
	for done < len(p) {
		n, err := unix.Write(c.fd, p[done:])
		done += max(n, 0)
		switch {
		case err == nil, err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			if err := c.setTimeout(unix.SO_SNDTIMEO); err != nil {
				return done, c.ioError("write", err)
			}
			continue
		}
		return done, c.ioError("write", os.NewSyscallError("write", err))
	}
	return done, nil
}

// shutdown ends the calls blocked on the socket: a connect fails, a read
// finds the end, a write the broken pipe.
func (c *blockConn) shutdown() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		_ = unix.Shutdown(c.fd, unix.SHUT_RDWR)
	}
}

func (c *blockConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	<-blockSlots
	if c.fd < 0 {
		return nil
	}
	c.stop()
	return os.NewSyscallError("close", unix.Close(c.fd))
}

// dialError is net's for a failed dial: "dial tcp <addr>: connect: ...".
func (c *blockConn) dialError(err error) error {
	return &net.OpError{Op: "dial", Net: "tcp", Addr: c.raddr, Err: err}
}

// ioError is net's for a failed read or write on a connection: it names
// both ends, so the local address is looked up, only for the message.
func (c *blockConn) ioError(op string, err error) error {
	var local net.Addr
	if sa, err := unix.Getsockname(c.fd); err == nil {
		switch sa := sa.(type) {
		case *unix.SockaddrInet4:
			local = &net.TCPAddr{IP: sa.Addr[:], Port: sa.Port}
		case *unix.SockaddrInet6:
			local = &net.TCPAddr{IP: sa.Addr[:], Port: sa.Port}
		}
	}
	return &net.OpError{Op: op, Net: "tcp", Source: local, Addr: c.raddr, Err: err}
}
