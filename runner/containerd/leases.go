package containerd

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	ctrd "github.com/containerd/containerd"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/leases"
)

// containerd's client protects what a create, pull or import writes with a
// lease of its own, expiring after 24 h. A noderun killed mid-operation
// leaves that lease, and the snapshot or content it holds, for a day; a
// pull given up on deletes it with the cancelled context and leaves it too.
// So noderun takes these leases itself, labelled with the operation and the
// process, deletes them with a fresh context, and at start releases those
// whose process is gone.

// LabelLease marks a lease noderun took; its value is the operation.
const LabelLease = labelPrefix + "lease"

// Lease purposes.
const (
	leaseCreate = "create"
	leasePull   = "pull"
	leaseImport = "import"
)

// LabelLeaseOwner names the process that took a lease ("<boot id> <pid>
// <pid start time>"): a lease whose owner is gone is left over, whatever
// its age, and one whose owner lives (`noderun images import` beside the
// daemon) is in use.
const LabelLeaseOwner = labelPrefix + "lease.owner"

// self is this process, as LabelLeaseOwner names it.
var self = procIDOf(uint32(os.Getpid())).String()

// withLease runs fn with a context carrying a new lease of noderun's, and
// deletes the lease afterwards whatever became of ctx.
func withLease(ctx context.Context, c *ctrd.Client, purpose string, fn func(context.Context) error) error {
	ls := c.LeasesService()
	l, err := newLease(ctx, ls, purpose)
	if err != nil {
		return err
	}
	defer func() { _ = deleteLease(ctx, ls, l) }()
	return fn(leases.WithLease(ctx, l.ID))
}

// withCreateLease is withLease for a container's creation, where the lease
// only covers the snapshot until the container record holds it: once fn
// succeeded, the lease is deleted off the start's path (a round trip and a
// metadata commit, 1.2 ms here): in the background or, when the daemon
// keeps a stock (see StockCreateLeases), once creations pause. One a
// noderun killed meanwhile leaves is released at its next start.
func (r *Runtime) withCreateLease(ctx context.Context, fn func(context.Context) error) error {
	ls := r.client.LeasesService()
	l, ok := r.leaseStock.take()
	if !ok {
		var err error
		if l, err = newLease(ctx, ls, leaseCreate); err != nil {
			return err
		}
	}
	err := fn(leases.WithLease(ctx, l.ID))
	if r.leaseStock.spend(l) {
		return err
	}
	if err != nil {
		_ = deleteLease(ctx, ls, l)
		return err
	}
	go deleteLease(ctx, ls, l)
	return nil
}

// Taking a lease is a round trip and a metadata commit that containerd
// syncs to disk: 2.0 ms (median) of each container's creation here, before
// its snapshot and record, on the path to its start. The daemon keeps a few
// create leases taken ahead instead. Neither topping the stock up nor
// deleting the spent leases happens while containers are being created:
// each commit syncs containerd's metadata to the disk that also holds the
// containers' rootfs and logs, and, done meanwhile, they slowed the task
// creations beside them (5 containers of a pod created at once: 133 ms
// against 100 ms without a stock, medians of 9).
const (
	leaseStockSize = 4 // a pod's containers are created all at once
	// leaseStockFresh is the oldest a stocked lease is used at: containerd
	// expires it after a day by the host's clock (which may jump, on a
	// board without a battery-backed one), and a creation must not find
	// its lease gone.
	leaseStockFresh = time.Hour
	// leaseTidyAfter is how long after the last creation the spent
	// leases are deleted and the stock filled.
	leaseTidyAfter = time.Second
)

// leaseStock holds create leases taken ahead of need, oldest first, and
// those spent, until creations pause.
type leaseStock struct {
	ctx     context.Context // nil until StockCreateLeases: no stock
	ls      leases.Manager
	mu      sync.Mutex
	ready   []leases.Lease
	spent   []leases.Lease
	tidy    *time.Timer
	filling bool
}

// StockCreateLeases has container creations take their lease from a stock
// kept by this runtime, and fills it. The stocked leases belong to this
// process like any it takes: ReleaseLeftoverLeases deletes them once it is
// gone, and containerd expires them after a day.
func (r *Runtime) StockCreateLeases() {
	s := &r.leaseStock
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ctx, s.ls = r.ctx(context.Background()), r.client.LeasesService()
	s.tidy = time.AfterFunc(0, s.tidyUp)
}

// take returns the newest stocked lease, if one is fresh; the stale ones
// are spent.
func (s *leaseStock) take() (leases.Lease, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.ready) > 0 && stale(s.ready[0]) {
		s.spent = append(s.spent, s.ready[0])
		s.ready = s.ready[1:]
	}
	n := len(s.ready)
	if n == 0 {
		return leases.Lease{}, false
	}
	l := s.ready[n-1]
	s.ready = s.ready[:n-1]
	return l, true
}

// stale reports whether a stocked lease is too old to be used, by the wall
// clock, containerd's: a jump forward ages it.
func stale(l leases.Lease) bool {
	return time.Now().Round(0).Sub(l.CreatedAt) >= leaseStockFresh
}

// spend keeps l, whose creation is done or failed, for deletion once
// creations pause. It reports false when there is no stock.
func (s *leaseStock) spend(l leases.Lease) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx == nil {
		return false
	}
	s.spent = append(s.spent, l)
	s.tidy.Reset(leaseTidyAfter)
	return true
}

// tidyUp deletes the spent leases and takes leases until the stock is full
// (unless another tidyUp is filling it). A lease it could not delete
// (containerd down, as it may be when a creation with a stocked lease
// failed) is tried again a second later. A failure to take one leaves the
// stock short: creations then take their own lease, and the next tidyUp
// fills it.
func (s *leaseStock) tidyUp() {
	s.mu.Lock()
	spent := s.spent
	s.spent = nil
	s.mu.Unlock()
	var left []leases.Lease
	for _, l := range spent {
		if err := deleteLease(s.ctx, s.ls, l); err != nil && !errdefs.IsNotFound(err) {
			left = append(left, l)
		}
	}
	s.mu.Lock()
	if len(left) > 0 {
		s.spent = append(s.spent, left...)
		s.tidy.Reset(leaseTidyAfter)
	}
	if s.filling {
		s.mu.Unlock()
		return
	}
	s.filling = true
	defer func() { s.filling = false; s.mu.Unlock() }()
	for len(s.ready) < leaseStockSize {
		s.mu.Unlock()
		l, err := newLease(s.ctx, s.ls, leaseCreate)
		s.mu.Lock()
		if err != nil {
			return
		}
		s.ready = append(s.ready, l)
	}
}

// newLease takes a lease of noderun's for purpose.
func newLease(ctx context.Context, ls leases.Manager, purpose string) (leases.Lease, error) {
	l, err := ls.Create(ctx, leases.WithRandomID(), leases.WithExpiration(24*time.Hour),
		leases.WithLabels(map[string]string{LabelLease: purpose, LabelLeaseOwner: self}))
	if err != nil {
		return l, fmt.Errorf("create lease: %w", err)
	}
	return l, nil
}

// deleteLease deletes l whatever became of ctx.
func deleteLease(ctx context.Context, ls leases.Manager, l leases.Lease) error {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	return ls.Delete(dctx, l)
}

// ReleaseLeftoverLeases deletes the leases of noderun processes that are
// gone (killed mid-operation); what they held is then collected by
// containerd.
func ReleaseLeftoverLeases(ctx context.Context, c *ctrd.Client) (int, error) {
	ls := c.LeasesService()
	all, err := ls.List(ctx, fmt.Sprintf("labels.%q", LabelLease))
	if err != nil {
		return 0, fmt.Errorf("list leases: %w", err)
	}
	n := 0
	for _, l := range all {
		if owner, ok := parseProcID(l.Labels[LabelLeaseOwner]); ok && owner.alive() {
			continue
		}
		if err := ls.Delete(ctx, l); err != nil && !errdefs.IsNotFound(err) {
			return n, fmt.Errorf("delete lease %s: %w", l.ID, err)
		}
		n++
	}
	return n, nil
}
