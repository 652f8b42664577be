package prober

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"
)

// bothPaths runs f once with blocking connections and once through the
// netpoller (no blocking slot free), which must not differ.
func bothPaths(t *testing.T, f func(t *testing.T)) {
	t.Run("blocking", f)
	t.Run("netpoller", func(t *testing.T) {
		for range cap(blockSlots) {
			blockSlots <- struct{}{}
		}
		defer func() {
			for range cap(blockSlots) {
				<-blockSlots
			}
		}()
		f(t)
	})
	if n := len(blockSlots); n != 0 {
		t.Errorf("%d blocking slots still held after the probes", n)
	}
}

func TestHTTPProbeBothPaths(t *testing.T) {
	s := newProbeServer(t, "127.0.0.1:0", false)
	closed := closedPort(t)
	bothPaths(t, func(t *testing.T) {
		for _, tc := range []struct {
			name, path string
			port       int
			timeout    time.Duration
			want       Result
			wantMsg    string
		}{
			{"ok", "/", s.port, passTimeout, Success, ""},
			{"redirected", "/hops/3", s.port, passTimeout, Success, ""},
			{"failing", "/status/503", s.port, passTimeout, Failure, "HTTP probe failed with statuscode: 503"},
			{"refused", "/", closed, passTimeout, Failure,
				fmt.Sprintf(`Get "http://127.0.0.1:%d/": dial tcp 127.0.0.1:%d: connect: connection refused`, closed, closed)},
			{"timeout", "/slow", s.port, 200 * time.Millisecond, Failure,
				fmt.Sprintf(`Get "http://127.0.0.1:%d/slow": context deadline exceeded (Client.Timeout exceeded while awaiting headers)`, s.port)},
		} {
			res, msg, err := probeHTTP(t, httpGet(intstr.FromInt(tc.port), tc.path), "127.0.0.1", tc.timeout)
			if res != tc.want || msg != tc.wantMsg || err != nil {
				t.Errorf("%s: got %v %q %v, want %v %q", tc.name, res, msg, err, tc.want, tc.wantMsg)
			}
		}
	})
}

// serveRaw hands each connection to a fresh listener to handle, in a
// goroutine of its own, and returns the listener's port.
func serveRaw(t *testing.T, handle func(net.Conn)) int {
	l, port := listen(t, "127.0.0.1:0")
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go handle(conn)
		}
	}()
	return port
}

// TestHTTPProbeSlowAnswer: an answer that takes a while, well within the
// timeout, passes (the blocking read waits for it rather than timing out
// on the kernel's first wake-up).
func TestHTTPProbeSlowAnswer(t *testing.T) {
	port := serveRaw(t, func(conn net.Conn) {
		defer conn.Close()
		http.ReadRequest(bufio.NewReader(conn))
		time.Sleep(300 * time.Millisecond) // the slowness under test
		fmt.Fprint(conn, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	})
	bothPaths(t, func(t *testing.T) {
		if res, msg, err := probeHTTP(t, httpGet(intstr.FromInt(port), "/"), "127.0.0.1", passTimeout); res != Success || err != nil {
			t.Errorf("got %v %q %v, want Success", res, msg, err)
		}
	})
}

// TestHTTPProbeReset: a connection reset is worded as package net words
// it, both ends named.
func TestHTTPProbeReset(t *testing.T) {
	port := serveRaw(t, func(conn net.Conn) {
		http.ReadRequest(bufio.NewReader(conn))
		conn.(*net.TCPConn).SetLinger(0) // close with a reset
		conn.Close()
	})
	want := regexp.MustCompile(`^Get "http://127\.0\.0\.1:` + strconv.Itoa(port) +
		`/": read tcp 127\.0\.0\.1:\d+->127\.0\.0\.1:` + strconv.Itoa(port) + `: read: connection reset by peer$`)
	bothPaths(t, func(t *testing.T) {
		if res, msg, err := probeHTTP(t, httpGet(intstr.FromInt(port), "/"), "127.0.0.1", passTimeout); res != Failure || !want.MatchString(msg) || err != nil {
			t.Errorf("got %v %q %v, want Failure matching %s", res, msg, err, want)
		}
	})
}

// TestHTTPProbeCancelled: stopping the worker ends a probe waiting for an
// answer at once, not at its timeout.
func TestHTTPProbeCancelled(t *testing.T) {
	asked := make(chan struct{}, 1)
	port := serveRaw(t, func(conn net.Conn) {
		defer conn.Close()
		r := bufio.NewReader(conn)
		http.ReadRequest(r)
		asked <- struct{}{}
		io.Copy(io.Discard, r) // never answered, until the prober hangs up
	})
	bothPaths(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		type outcome struct {
			res Result
			msg string
			err error
		}
		done := make(chan outcome, 1)
		go func() {
			res, msg, err := Do(ctx, httpGet(intstr.FromInt(port), "/"), time.Hour, Target{PodIP: "127.0.0.1"}, nil)
			done <- outcome{res, msg, err}
		}()
		<-asked
		cancel()
		select {
		case o := <-done:
			if want := fmt.Sprintf(`Get "http://127.0.0.1:%d/": context canceled`, port); o.res != Failure || o.msg != want || o.err != nil {
				t.Errorf("got %v %q %v, want Failure %q", o.res, o.msg, o.err, want)
			}
		case <-time.After(time.Minute): // the probe's timeout is an hour
			t.Fatal("a cancelled probe still waits for its answer")
		}
	})
}
