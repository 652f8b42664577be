package kubeapi

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// What the API allows a client, so that neither token (nor a client with
// none) can exhaust the node's memory, goroutines or file descriptors.
const (
	// maxConnections bounds the API's open connections; past it, new
	// ones wait in the listen queue until one closes.
	maxConnections = 256
	// maxHeaderBytes bounds a request's headers (Go's default is 1 MiB);
	// kubectl sends well under 4 KiB.
	maxHeaderBytes = 32 << 10
	// writeTimeout bounds each write to a client: a client that stops
	// reading (kubectl suspended with ^Z, a stuck proxy) has its request
	// ended rather than holding it, and what it was sent, for good.
	writeTimeout = time.Minute
	// minWatchTimeout is the API server's --min-request-timeout: a watch
	// without timeoutSeconds ends after a random time between it and twice
	// it, and the client watches again.
	minWatchTimeout = 30 * time.Minute
)

// longRunning is a kind of request that lasts: each is capped per token.
type longRunning int

const (
	watches     longRunning = iota
	follows                 // logs -f
	remoteCalls             // exec, attach, port-forward sessions
	nLongRunning
)

func (k longRunning) String() string {
	return [...]string{"watches", "log follows", "exec, attach and port-forward sessions"}[k]
}

// defaultCaps is how many requests of each kind one token may have open at
// once. kubectl opens one of them per command; a dashboard a few watches,
// stern one follow per container.
var defaultCaps = [nLongRunning]int{watches: 32, follows: 64, remoteCalls: 16}

// limiter counts the long-running requests open per token.
type limiter struct {
	caps [nLongRunning]int
	mu   sync.Mutex
	open map[role]*[nLongRunning]int
}

func newLimiter(caps [nLongRunning]int) *limiter {
	return &limiter{caps: caps, open: map[role]*[nLongRunning]int{}}
}

// acquire counts a request of kind k for the token with role rl; release
// once it ends. Past the cap it answers 429, as the API server answers past
// its max-in-flight, and returns false.
func (l *limiter) acquire(w http.ResponseWriter, rl role, k longRunning) (release func(), ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.open[rl]
	if n == nil {
		n = new([nLongRunning]int)
		l.open[rl] = n
	}
	if n[k] >= l.caps[k] {
		w.Header().Set("Retry-After", "1")
		writeStatus(w, tooManyRequests(fmt.Sprintf("too many concurrent %s for the %s token (at most %d): end one first", k, rl, l.caps[k])))
		return nil, false
	}
	n[k]++
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			n[k]--
			l.mu.Unlock()
		})
	}, true
}

func tooManyRequests(msg string) *metav1.Status {
	st := status(http.StatusTooManyRequests, metav1.StatusReasonTooManyRequests, msg)
	st.Details = &metav1.StatusDetails{RetryAfterSeconds: 1}
	return st
}

func (r role) String() string {
	switch r {
	case roleAdmin:
		return "admin"
	case roleView:
		return "view"
	}
	return "no"
}

// randomWatchTimeout is how long a watch without timeoutSeconds lasts:
// random, so that watches opened together do not all end together.
func randomWatchTimeout() time.Duration {
	return minWatchTimeout + rand.N(minWatchTimeout)
}

// streamWriter writes a long response (a watch, a log follow): each write,
// with its flush, must be taken within timeout, while the waits between
// them are the client's to make.
type streamWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
}

// newStreamWriter lifts the whole-response deadline ServeHTTP sets; call
// done when the response ends.
func newStreamWriter(w http.ResponseWriter, timeout time.Duration) *streamWriter {
	sw := &streamWriter{w: w, rc: http.NewResponseController(w), timeout: timeout}
	_ = sw.rc.SetWriteDeadline(time.Time{})
	return sw
}

// begin starts a batch of writes: they and the flush that ends the batch
// must be taken within the timeout. Every batch must end with a flush: a
// deadline left while nothing is written would end an idle HTTP/2 stream.
func (sw *streamWriter) begin() { _ = sw.rc.SetWriteDeadline(time.Now().Add(sw.timeout)) }

// Write writes within a batch.
func (sw *streamWriter) Write(p []byte) (int, error) { return sw.w.Write(p) }

// flush sends what was written and ends the batch: no deadline while the
// response waits for more.
func (sw *streamWriter) flush() error {
	if err := sw.rc.Flush(); err != nil {
		return err
	}
	_ = sw.rc.SetWriteDeadline(time.Time{})
	return nil
}

// flushWriter writes each write as a batch of its own: a follow's lines
// must not wait in a buffer.
type flushWriter struct{ sw *streamWriter }

func (f flushWriter) Write(p []byte) (int, error) {
	f.sw.begin()
	n, err := f.sw.Write(p)
	if err == nil {
		err = f.sw.flush()
	}
	return n, err
}

// done bounds what the server still writes after the handler returns.
func (sw *streamWriter) done() { _ = sw.rc.SetWriteDeadline(time.Now().Add(sw.timeout)) }

// wholeResponseDeadline bounds the writing of an ordinary answer; the
// long responses lift it.
func wholeResponseDeadline(w http.ResponseWriter) {
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(writeTimeout))
}
