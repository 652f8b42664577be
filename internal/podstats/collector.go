package podstats

import (
	"context"
	"sync"
	"time"

	"github.com/noderun/noderun/internal/cgroups"
	"k8s.io/utils/clock"
)

// Pod is where one pod's usage is read.
type Pod struct {
	Name, Namespace, UID string
	StartTime            time.Time
	Cgroup               string      // the pod's cgroup parent, a cgroupsPath
	Containers           []Container // the running ones
	Volumes              []Volume    // emptyDirs
	LogDir               string      // the pod's log dir: a container's logs are in LogDir/<name>
}

// Container is one running container of a pod.
type Container struct {
	Name, ID, Image string
	Cgroup          string // its cgroupsPath
	StartTime       time.Time
}

// Volume is an emptyDir and where it is.
type Volume struct{ Name, Path string }

// Config is what a Collector reads.
type Config struct {
	NodeName string
	// Pods lists the pods to read, at each collection.
	Pods    func() []Pod
	Cgroups cgroups.Layout
	// NodeDir is on the filesystem of the node's pods' volumes and logs:
	// the node's fs and each pod's ephemeral storage capacity.
	NodeDir string
	Clock   clock.Clock // nil: the real one
	ProcDir string      // "": /proc
	// WritableLayer reads a container's writable layer, its rootfs in
	// the Summary: bytes and inodes used, and a directory on its
	// filesystem ("": unknown); nil: no rootfs figures.
	WritableLayer func(ctx context.Context, containerID string) (used, inodes uint64, fsDir string, err error)
}

// The collection's timing.
const (
	// cacheFor is how long one collection answers every request: kubectl
	// top and a scrape that come together read the cgroups once.
	cacheFor = 2 * time.Second
	// firstWindow is the wait for a second CPU sample when a cgroup has
	// no recent first one: the first request, or a new container.
	firstWindow = time.Second
	// maxWindow is the oldest sample a rate is taken from: a rate over an
	// hour since the last request would not be current usage.
	maxWindow = 2 * time.Minute
)

// Collector reads usage on request. It keeps only the last collection and
// each cgroup's last CPU sample; nothing runs between requests.
type Collector struct {
	cfg   Config
	clock clock.Clock

	mu   sync.Mutex // one collection at a time; the others wait for it
	last *Snapshot
	prev map[string]cpuSample // by cgroupsPath; "" is the node
}

type cpuSample struct {
	at    time.Time
	nanos uint64
}

// New returns a Collector for cfg.
func New(cfg Config) *Collector {
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.ProcDir == "" {
		cfg.ProcDir = "/proc"
	}
	return &Collector{cfg: cfg, clock: cfg.Clock, prev: map[string]cpuSample{}}
}

// Snapshot is one collection: the Summary, and what the cAdvisor series
// need beyond it.
type Snapshot struct {
	Summary    Summary
	At         time.Time
	Node       cgroups.Usage
	NodeWindow time.Duration // of the node's CPU rate; 0: none
	Pods       []PodSample
}

// PodSample is a pod's raw usage, in the order of Summary.Pods.
type PodSample struct {
	Pod        Pod
	Usage      *cgroups.Usage // nil when its cgroup could not be read
	Window     time.Duration  // of its CPU rate; 0: none yet
	Containers []ContainerSample
	Network    []Interface
}

// ContainerSample is a container's raw usage.
type ContainerSample struct {
	Container Container
	Usage     cgroups.Usage
	Window    time.Duration
}

// Snapshot returns the latest collection, collecting anew when the last
// is older than cacheFor. The result is shared: callers must not change it.
func (c *Collector) Snapshot(ctx context.Context) (*Snapshot, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last != nil && c.clock.Since(c.last.At) < cacheFor {
		return c.last, nil
	}
	pods := c.cfg.Pods()
	if err := c.warmUp(ctx, pods); err != nil {
		return nil, err
	}
	s, err := c.collect(ctx, pods)
	if err != nil {
		return nil, err
	}
	c.last = s
	return s, nil
}

// Summary is the latest collection as /stats/summary.
func (c *Collector) Summary(ctx context.Context) (*Summary, error) {
	s, err := c.Snapshot(ctx)
	if err != nil {
		return nil, err
	}
	return &s.Summary, nil
}

// warmUp takes a first CPU sample of every cgroup that has no recent one,
// and waits firstWindow for the second, so that every rate has a window.
func (c *Collector) warmUp(ctx context.Context, pods []Pod) error {
	now := c.clock.Now()
	fresh := func(key string) bool {
		p, ok := c.prev[key]
		return ok && now.Sub(p.at) <= maxWindow
	}
	took := false
	take := func(key string, read func() (uint64, error)) {
		if fresh(key) {
			return
		}
		if n, err := read(); err == nil {
			c.prev[key] = cpuSample{now, n}
			took = true
		}
	}
	take("", func() (uint64, error) {
		u, err := c.cfg.Cgroups.NodeUsage(c.cfg.ProcDir)
		return u.CPU, err
	})
	for _, p := range pods {
		take(p.Cgroup, func() (uint64, error) { return c.cfg.Cgroups.CPU(p.Cgroup) })
		for _, ct := range p.Containers {
			take(ct.Cgroup, func() (uint64, error) { return c.cfg.Cgroups.CPU(ct.Cgroup) })
		}
	}
	if !took {
		return nil
	}
	select {
	case <-c.clock.After(firstWindow):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// rate is the CPU rate in nanocores of the cgroup key since its last
// sample, and the window; it keeps this sample, in next, as the start of
// the next collection's window.
func (c *Collector) rate(next map[string]cpuSample, key string, at time.Time, nanos uint64) (*uint64, time.Duration) {
	next[key] = cpuSample{at, nanos}
	p, ok := c.prev[key]
	window := at.Sub(p.at)
	if !ok || window <= 0 || window > maxWindow || nanos < p.nanos {
		return nil, 0
	}
	r := uint64(float64(nanos-p.nanos) / window.Seconds())
	return &r, window
}

// collect reads every cgroup once, and the pods' networks, volumes and
// writable layers.
func (c *Collector) collect(ctx context.Context, pods []Pod) (*Snapshot, error) {
	at := c.clock.Now()
	next := make(map[string]cpuSample, len(c.prev))
	node, err := c.cfg.Cgroups.NodeUsage(c.cfg.ProcDir)
	if err != nil {
		return nil, err
	}
	s := &Snapshot{At: at, Node: node}
	nodeRate, window := c.rate(next, "", at, node.CPU)
	s.NodeWindow = window
	s.Summary.Node = c.nodeStats(at, node, nodeRate)
	s.Summary.Pods = []PodStats{}
	for _, p := range pods {
		ps := PodSample{Pod: p}
		var podRate *uint64
		if u, err := c.cfg.Cgroups.Usage(p.Cgroup); err == nil {
			ps.Usage = &u
			podRate, ps.Window = c.rate(next, p.Cgroup, at, u.CPU)
		}
		var rates []*uint64
		for _, ct := range p.Containers {
			u, err := c.cfg.Cgroups.Usage(ct.Cgroup)
			if err != nil {
				continue // ended since the pods were listed
			}
			r, w := c.rate(next, ct.Cgroup, at, u.CPU)
			ps.Containers = append(ps.Containers, ContainerSample{Container: ct, Usage: u, Window: w})
			rates = append(rates, r)
		}
		ps.Network = c.podNetwork(ps)
		s.Pods = append(s.Pods, ps)
		s.Summary.Pods = append(s.Summary.Pods, c.podStats(ctx, at, ps, podRate, rates))
	}
	c.prev = next
	return s, nil
}
