package containerd

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/containerd/containerd/leases"
)

func namespaceExists(t *testing.T, rt *Runtime) bool {
	t.Helper()
	nss, err := rt.client.NamespaceService().List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return slices.Contains(nss, rt.namespace)
}

func TestResetEmptiesTheNamespace(t *testing.T) {
	rt := testRuntime(t)
	ctx := context.Background()
	cfg := testConfig(t, rt, "reset", "sleep", "600")
	if _, err := rt.StartContainer(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.client.LeasesService().Create(rt.ctx(ctx), leases.WithRandomID(), leases.WithExpiration(time.Hour),
		leases.WithLabels(map[string]string{LabelLease: leaseImport, LabelLeaseOwner: self})); err != nil {
		t.Fatal(err)
	}

	// Without images: containers and leases go, images and the namespace stay.
	if kept, err := rt.Reset(ctx, false); err != nil || kept != nil {
		t.Fatalf("Reset(false) = %v, %v", kept, err)
	}
	if cs, _ := rt.client.Containers(rt.ctx(ctx)); len(cs) != 0 {
		t.Errorf("%d containers left", len(cs))
	}
	if ls, _ := rt.client.LeasesService().List(rt.ctx(ctx)); len(ls) != 0 {
		t.Errorf("%d leases left", len(ls))
	}
	if imgs, _ := rt.client.ImageService().List(rt.ctx(ctx)); len(imgs) == 0 || !namespaceExists(t, rt) {
		t.Fatalf("images (%d) or namespace removed without removeImages", len(imgs))
	}

	// With images: the namespace is empty, so containerd deletes it.
	if kept, err := rt.Reset(ctx, true); err != nil || kept != nil {
		t.Fatalf("Reset(true) = %v, %v", kept, err)
	}
	if namespaceExists(t, rt) {
		t.Fatal("namespace still there")
	}
	// Idempotent.
	if kept, err := rt.Reset(ctx, true); err != nil || kept != nil {
		t.Fatalf("second Reset(true) = %v, %v", kept, err)
	}
}
