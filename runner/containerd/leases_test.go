package containerd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/leases"
	"github.com/containerd/containerd/snapshots"

	"github.com/noderun/noderun/internal/testenv"
)

// A lease noderun takes is deleted even when the operation's context was
// cancelled (a pull given up on); containerd's own is not.
func TestLeaseDeletedAfterCancel(t *testing.T) {
	rt := testRuntime(t)
	ctx, cancel := context.WithCancel(rt.ctx(context.Background()))
	var id string
	err := withLease(ctx, rt.client, leasePull, func(ctx context.Context) error {
		id, _ = leases.FromContext(ctx)
		cancel() // the progress watchdog gave up
		return ctx.Err()
	})
	if !errors.Is(err, context.Canceled) || id == "" {
		t.Fatalf("err %v, lease %q", err, id)
	}
	all, err := rt.client.LeasesService().List(rt.ctx(context.Background()))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range all {
		if l.ID == id {
			t.Fatalf("lease %s outlived its pull", id)
		}
	}
}

// What a noderun killed mid-create left (its lease and the snapshot the
// lease held) is released at the next start, and containerd collects the
// snapshot; another program's lease and one of a live noderun process (an
// import beside the daemon) stay, however old.
func TestReleaseLeftoverLeases(t *testing.T) {
	testenv.SkipIfEmulated(t, ownStatFaked)
	rt := testRuntime(t)
	ctx := rt.ctx(context.Background())
	ls := rt.client.LeasesService()
	dead := fmt.Sprintf("%s %d %d", bootID, 1<<30, 1) // a PID that cannot exist
	left, err := ls.Create(ctx, leases.WithRandomID(), leases.WithLabels(map[string]string{LabelLease: leaseCreate, LabelLeaseOwner: dead}))
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, rt, "killed-mid-create", "true")
	facts, _ := rt.imageFacts(digestOf(cfg.Image.ID))
	if _, err := rt.client.SnapshotService(rt.snapshotter).Prepare(leases.WithLease(ctx, left.ID), cfg.ID, facts.chainID); err != nil {
		t.Fatal(err)
	}
	foreign, err := ls.Create(ctx, leases.WithRandomID())
	if err != nil {
		t.Fatal(err)
	}
	importing, err := ls.Create(ctx, leases.WithRandomID(), leases.WithLabels(map[string]string{LabelLease: leaseImport, LabelLeaseOwner: self}))
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Delete(ctx, foreign)
	defer ls.Delete(ctx, importing)

	n, err := ReleaseLeftoverLeases(ctx, rt.client)
	if err != nil || n != 1 {
		t.Fatalf("released %d, %v; want the dead process's lease only", n, err)
	}
	all, _ := ls.List(ctx)
	ids := map[string]bool{}
	for _, l := range all {
		ids[l.ID] = true
	}
	if ids[left.ID] || !ids[foreign.ID] || !ids[importing.ID] {
		t.Fatalf("leases after release %v; want %s gone, %s and %s kept", ids, left.ID, foreign.ID, importing.ID)
	}
	// containerd collects on its own schedule, which spaces collections by
	// fifty times their average length (a busy machine makes that seconds);
	// a synchronous delete collects at once.
	gc, err := ls.Create(ctx, leases.WithRandomID())
	if err != nil {
		t.Fatal(err)
	}
	if err := ls.Delete(ctx, gc, leases.SynchronousDelete); err != nil {
		t.Fatal(err)
	}
	sn := rt.client.SnapshotService(rt.snapshotter)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, err := sn.Stat(ctx, cfg.ID); errdefs.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			var keys []string
			_ = sn.Walk(ctx, func(_ context.Context, i snapshots.Info) error { keys = append(keys, i.Name); return nil })
			t.Fatalf("the interrupted create's snapshot was not collected: %v", keys)
		}
	}
}

// ownStatFaked is why the lease owner tests skip under user-mode emulation.
const ownStatFaked = "qemu-user fakes /proc/<own pid>/stat with each thread's start time, so this process's ID does not match itself"

func TestLeaseOwnerAlive(t *testing.T) {
	testenv.SkipIfEmulated(t, ownStatFaked)
	ownerAlive := func(s string) bool { p, ok := parseProcID(s); return ok && p.alive() }
	if !ownerAlive(self) {
		t.Fatalf("this process (%q) is not alive", self)
	}
	for _, owner := range []string{"", "garbage", "other-boot 1 1", fmt.Sprintf("%s %d 1", bootID, os.Getpid()),
		fmt.Sprintf("%s %d 0", bootID, os.Getpid())} {
		if ownerAlive(owner) {
			t.Errorf("owner %q counts as alive", owner)
		}
	}
}

// A container's creation lease goes once the container holds its snapshot,
// in the background; when the creation fails it is gone on return.
func TestCreateLeaseReleased(t *testing.T) {
	rt := testRuntime(t)
	ctx := rt.ctx(context.Background())
	createLeases := func() int {
		all, err := rt.client.LeasesService().List(ctx, fmt.Sprintf("labels.%q==%s", LabelLease, leaseCreate))
		if err != nil {
			t.Fatal(err)
		}
		return len(all)
	}
	if err := rt.withCreateLease(ctx, func(context.Context) error { return errdefs.ErrInvalidArgument }); err == nil || createLeases() != 0 {
		t.Fatalf("failed creation: err %v, %d create leases left", err, createLeases())
	}

	cfg := testConfig(t, rt, "create-lease", "sleep", "600")
	startContainer(t, rt, cfg)
	for deadline := time.Now().Add(30 * time.Second); createLeases() != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the creation's lease outlived the container's creation")
		}
	}
	if _, err := rt.client.SnapshotService(rt.snapshotter).Stat(ctx, cfg.ID); err != nil {
		t.Fatalf("the container's snapshot without the lease: %v", err)
	}
}

// With the stock on, a creation takes a lease taken ahead and
// the stock is topped up after it; stale stocked leases are not used but
// deleted, as is a failed creation's lease.
func TestCreateLeaseStock(t *testing.T) {
	rt := testRuntime(t)
	ctx := rt.ctx(context.Background())
	createLeases := func() map[string]bool {
		all, err := rt.client.LeasesService().List(ctx, fmt.Sprintf("labels.%q==%s", LabelLease, leaseCreate))
		if err != nil {
			t.Fatal(err)
		}
		ids := map[string]bool{}
		for _, l := range all {
			if l.Labels[LabelLeaseOwner] != self {
				t.Errorf("lease %s owned by %q", l.ID, l.Labels[LabelLeaseOwner])
			}
			ids[l.ID] = true
		}
		return ids
	}
	// settled waits for the stock to be full and no other create lease
	// left, and returns the stock.
	settled := func(what string) map[string]bool {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			ids := createLeases()
			rt.leaseStock.mu.Lock()
			stock := len(rt.leaseStock.ready)
			rt.leaseStock.mu.Unlock()
			if len(ids) == leaseStockSize && stock == leaseStockSize {
				return ids
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d create leases in containerd, %d stocked; want %d", what, len(ids), stock, leaseStockSize)
			}
		}
	}
	rt.StockCreateLeases()
	first := settled("stocked at start")

	var used string
	if err := rt.withCreateLease(ctx, func(ctx context.Context) error {
		used, _ = leases.FromContext(ctx)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !first[used] {
		t.Fatalf("the creation took lease %s, not one of the stock %v", used, first)
	}
	before := settled("after a creation")
	if before[used] {
		t.Fatalf("lease %s outlived its creation", used)
	}
	cfg := testConfig(t, rt, "stocked-lease", "sleep", "600")
	startContainer(t, rt, cfg)
	second := settled("after a container's creation")
	if countIn(before, second) != leaseStockSize-1 {
		t.Fatalf("stock before %v, after %v: want the container's creation to have used one of it", before, second)
	}
	if _, err := rt.client.SnapshotService(rt.snapshotter).Stat(ctx, cfg.ID); err != nil {
		t.Fatalf("the container's snapshot without the lease: %v", err)
	}

	// Stocked leases as old as containerd's clock would make them after
	// a jump forward are not used.
	rt.leaseStock.mu.Lock()
	for i := range rt.leaseStock.ready {
		rt.leaseStock.ready[i].CreatedAt = time.Now().Add(-leaseStockFresh)
	}
	rt.leaseStock.mu.Unlock()
	if err := rt.withCreateLease(ctx, func(ctx context.Context) error {
		used, _ = leases.FromContext(ctx)
		return errdefs.ErrInvalidArgument
	}); err == nil || second[used] {
		t.Fatalf("err %v; the creation used lease %s of the stale stock %v", err, used, second)
	}
	// The stale stock and the failed creation's lease are deleted, and the
	// stock is filled anew.
	if third := settled("after the stale stock"); countIn(second, third) != 0 || third[used] {
		t.Fatalf("stale stock %v or the failed creation's lease %s still in containerd: %v", second, used, third)
	}
}

// countIn is how many of a are in b.
func countIn(a, b map[string]bool) int {
	n := 0
	for id := range a {
		if b[id] {
			n++
		}
	}
	return n
}
