package runner

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// RemoveAll tears down every pod noderun runs, as if every manifest had
// been removed: each pod's containers are stopped with its own grace
// period (preStop hooks run), then its containers, network, volumes,
// namespaces, cgroup and directories go. A network GC that keeps nothing
// follows, then the cgroup root when it is empty. It is for `noderun
// reset`, on an engine that is not Run; it returns once every pod is gone,
// or, when ctx ends first, which pods remain.
func (e *Engine) RemoveAll(ctx context.Context) error {
	wctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel() // a worker still retrying a failed teardown
		e.wg.Wait()
		e.probes.Stop()
	}()
	if err := e.removeOrphans(wctx); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		e.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("pods not removed: %s: %w", strings.Join(e.remaining(), ", "), ctx.Err())
	}
	if err := e.net.GC(ctx, map[string]bool{}); err != nil {
		return fmt.Errorf("network garbage collection: %w", err)
	}
	if err := e.cfg.Cgroups.RemoveRoot(ctx); err != nil {
		return fmt.Errorf("cgroup root: %w", err)
	}
	return nil
}

// remaining names the pods whose workers have not finished, sorted.
func (e *Engine) remaining() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]string, 0, len(e.workers))
	for uid, w := range e.workers {
		out = append(out, podRef(w.lastPod())+" ("+string(uid)+")")
	}
	slices.Sort(out)
	return out
}
