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
func (p *Pods) Watch(ctx context.Context, changed func(sandboxID string)) {
	go p.watchConfig(ctx, changed)
	err := cni.WatchLinkDeletions(ctx, func(name string) { p.interfaceDeleted(name, changed) })
	if err != nil {
		p.log.Error("watching host interfaces stopped; deleted veths are found by the periodic check only", "err", err)
	}
}

// interfaceDeleted marks the pods that used the host interface name
// suspect, so that their next Check asks the plugins, and pokes them.
func (p *Pods) interfaceDeleted(name string, changed func(sandboxID string)) {
	p.mu.Lock()
	var ids []string
	for id := range p.ifaces[name] {
		p.suspect[id] = true
		ids = append(ids, id)
	}
	p.mu.Unlock()
	for _, id := range ids {
		p.log.Warn("a pod's host interface was deleted", "interface", name, "sandbox", id)
		changed(id)
	}
}

// watchConfig pokes every pod (those waiting for a usable network retry at
// once) when a CNI conf or bin dir changes.
func (p *Pods) watchConfig(ctx context.Context, changed func(sandboxID string)) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		// No inotify instance left on the host: look every few seconds.
		p.log.Warn("cannot watch the CNI config; looking at it every 5s", "err", err)
		for range dirpoll.Events(ctx, 5*time.Second, p.cfgDirs...) {
			changed("")
		}
		return
	}
	defer w.Close()
	for _, d := range p.cfgDirs {
		if err := w.Add(d); err != nil {
			p.log.Debug("not watching", "dir", d, "err", err)
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.Events:
			changed("")
		case err := <-w.Errors:
			p.log.Warn("CNI config watch", "err", err)
		}
	}
}
