package containerd

import (
	"context"
	"fmt"
	"time"

	ctrd "github.com/containerd/containerd"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/leases"
)

// containerd's client protects what a create, pull or import writes with a
// lease of its own, expiring after 24 h. A noderun killed mid-operation
// leaves that lease, and the snapshot or content it holds, for a day; a
// pull given up on deletes it with the cancelled context and leaves it too.
// So noderun takes these leases itself, labelled, deletes them with a fresh
// context, and at start releases any a killed noderun left.

// LabelLease marks a lease noderun took; its value is the operation.
const LabelLease = labelPrefix + "lease"

// Lease purposes. Imports may also come from `noderun images import`, which
// runs beside the daemon, so only an old one is released at start.
const (
	leaseCreate = "create"
	leasePull   = "pull"
	leaseImport = "import"
)

// leftoverImportAge is the age past which an import lease counts as left
// behind rather than in use by a running `noderun images import`.
const leftoverImportAge = 10 * time.Minute

// withLease runs fn with a context carrying a new lease of noderun's, and
// deletes the lease afterwards whatever became of ctx.
func withLease(ctx context.Context, c *ctrd.Client, purpose string, fn func(context.Context) error) error {
	ls := c.LeasesService()
	l, err := ls.Create(ctx, leases.WithRandomID(), leases.WithExpiration(24*time.Hour),
		leases.WithLabels(map[string]string{LabelLease: purpose}))
	if err != nil {
		return fmt.Errorf("create lease: %w", err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = ls.Delete(dctx, l)
	}()
	return fn(leases.WithLease(ctx, l.ID))
}

// ReleaseLeftoverLeases deletes the leases an earlier noderun took and did
// not get to delete (it was killed); what they held is then collected by
// containerd. Call it before anything starts a create, pull or import.
func ReleaseLeftoverLeases(ctx context.Context, c *ctrd.Client) (int, error) {
	ls := c.LeasesService()
	all, err := ls.List(ctx, fmt.Sprintf("labels.%q", LabelLease))
	if err != nil {
		return 0, fmt.Errorf("list leases: %w", err)
	}
	n := 0
	for _, l := range all {
		if l.Labels[LabelLease] == leaseImport && time.Since(l.CreatedAt) < leftoverImportAge {
			continue
		}
		if err := ls.Delete(ctx, l); err != nil && !errdefs.IsNotFound(err) {
			return n, fmt.Errorf("delete lease %s: %w", l.ID, err)
		}
		n++
	}
	return n, nil
}
