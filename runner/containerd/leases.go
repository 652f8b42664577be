package containerd

import (
	"context"
	"fmt"
	"os"
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
	release, err := leased(ctx, c, purpose, fn)
	release()
	return err
}

// withCreateLease is withLease for a container's creation, where the lease
// only covers the snapshot until the container record holds it: once fn
// succeeded, the lease is deleted in the background, off the start's path
// (a round trip and a metadata commit, 1.2 ms here). One a noderun killed
// meanwhile leaves is released at its next start.
func withCreateLease(ctx context.Context, c *ctrd.Client, fn func(context.Context) error) error {
	release, err := leased(ctx, c, leaseCreate, fn)
	if err != nil {
		release()
		return err
	}
	go release()
	return nil
}

// leased runs fn with a context carrying a new lease of noderun's and
// returns what deletes the lease, whatever becomes of ctx.
func leased(ctx context.Context, c *ctrd.Client, purpose string, fn func(context.Context) error) (release func(), err error) {
	ls := c.LeasesService()
	l, err := ls.Create(ctx, leases.WithRandomID(), leases.WithExpiration(24*time.Hour),
		leases.WithLabels(map[string]string{LabelLease: purpose, LabelLeaseOwner: self}))
	if err != nil {
		return func() {}, fmt.Errorf("create lease: %w", err)
	}
	release = func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = ls.Delete(dctx, l)
	}
	return release, fn(leases.WithLease(ctx, l.ID))
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
