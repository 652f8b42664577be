package cni

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// DialLoopback connects to port on the loopback interface of the network
// namespace pinned at nsPath, as containerd's CRI PortForward does: IPv4
// first, then IPv6 when nothing listens there. With nsPath empty it dials
// the host's loopback (a hostNetwork pod).
func DialLoopback(ctx context.Context, nsPath string, port int) (net.Conn, error) {
	var conn net.Conn
	var err error
	for _, host := range []string{"127.0.0.1", "::1"} {
		conn, err = dialIn(ctx, nsPath, net.JoinHostPort(host, strconv.Itoa(port)))
		if err == nil || !errors.Is(err, syscall.ECONNREFUSED) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("cni: dial port %d in %s: %w", port, nsOrHost(nsPath), err)
	}
	return conn, nil
}

func nsOrHost(nsPath string) string {
	if nsPath == "" {
		return "the host's network"
	}
	return nsPath
}

// dialIn dials addr from inside the namespace: a socket belongs to the
// namespace of the thread that made it, and keeps it once made.
func dialIn(ctx context.Context, nsPath, addr string) (net.Conn, error) {
	var d net.Dialer
	if nsPath == "" {
		return d.DialContext(ctx, "tcp", addr)
	}
	ns, err := os.Open(nsPath)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	type result struct {
		conn net.Conn
		err  error
	}
	var r result
	onDiscardedThread(func() {
		// The thread leaves the host's network namespace.
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			r.err = fmt.Errorf("setns: %w", err)
			return
		}
		// An IP literal is dialled on this goroutine: the socket is made
		// on this thread.
		r.conn, r.err = d.DialContext(ctx, "tcp", addr)
	})
	return r.conn, r.err
}
