package sandbox

import (
	"context"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/noderun/noderun/cni"
	"github.com/noderun/noderun/internal/dirpoll"
)

// Watch reports deleted host interfaces to the pods using them, and changes
// to the CNI config or plugins to every pod (sandbox ID ""), through
// changed until ctx ends.
func (n *Pods) Watch(ctx context.Context, changed func(sandboxID string)) {
	go n.watchConfig(ctx, changed)
	err := cni.WatchLinkDeletions(ctx, func(name string) {
		n.mu.Lock()
		ids := n.ifaces[name]
		for id := range ids {
			n.suspect[id] = true
		}
		n.mu.Unlock()
		for id := range ids {
			n.log.Warn("a pod's host interface was deleted", "interface", name, "sandbox", id)
			changed(id)
		}
	})
	if err != nil {
		n.log.Error("watching host interfaces stopped; deleted veths are found by the periodic check only", "err", err)
	}
}

// watchConfig pokes every pod (those waiting for a usable network retry at
// once) when a CNI conf or bin dir changes.
func (n *Pods) watchConfig(ctx context.Context, changed func(sandboxID string)) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		// No inotify instance left on the host: look every few seconds.
		n.log.Warn("cannot watch the CNI config; looking at it every 5s", "err", err)
		for range dirpoll.Events(ctx, 5*time.Second, n.cfgDirs...) {
			changed("")
		}
		return
	}
	defer w.Close()
	for _, d := range n.cfgDirs {
		if err := w.Add(d); err != nil {
			n.log.Debug("not watching", "dir", d, "err", err)
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.Events:
			changed("")
		case err := <-w.Errors:
			n.log.Warn("CNI config watch", "err", err)
		}
	}
}
