package runner

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"

	"github.com/noderun/noderun/runner/prober"
)

// changes tells watchers (the Kubernetes API's watches) that pod statuses
// or events changed: a version counter and a channel closed at the next
// bump, so a watcher sleeps until something happens instead of polling.
type changes struct {
	mu      sync.Mutex
	version uint64
	next    chan struct{} // closed by the next bump
}

func (c *changes) bump() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.version++
	if c.next != nil {
		close(c.next)
		c.next = nil
	}
}

func (c *changes) current() (uint64, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.next == nil {
		c.next = make(chan struct{})
	}
	return c.version, c.next
}

// Changes returns the version of pod statuses and events, and a channel
// closed once either changes after that version.
func (e *Engine) Changes() (version uint64, changed <-chan struct{}) {
	return e.changes.current()
}

// probeResult passes a probe attempt's result on to OnProbeResult with the
// pod's name, under the kubelet's result names.
func (e *Engine) probeResult(uid, container string, kind prober.Kind, res prober.Result) {
	if e.cfg.OnProbeResult == nil {
		return
	}
	e.mu.Lock()
	pod := e.statuses[types.UID(uid)]
	var ns, name string
	if pod != nil {
		ns, name = pod.Namespace, pod.Name
	}
	e.mu.Unlock()
	result := map[prober.Result]string{prober.Success: "successful", prober.Failure: "failed"}[res]
	if result == "" {
		result = "unknown"
	}
	e.cfg.OnProbeResult(ns, name, uid, container, kind.String(), result)
}
