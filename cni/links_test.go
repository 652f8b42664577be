package cni

import (
	"context"
	"os/exec"
	"slices"
	"testing"
	"time"
)

func TestWatchLinkDeletionsSeesADeletedVeth(t *testing.T) {
	requireRoot(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	gone := make(chan string, 16)
	done := make(chan error, 1)
	go func() { done <- WatchLinkDeletions(ctx, func(name string) { gone <- name }) }()

	// The subscription is set up asynchronously, with nothing to tell when
	// it is: the pair is added and deleted again until a deletion is
	// reported (a fixed wait may be too short on a busy machine).
	var seen []string
	deadline := time.Now().Add(30 * time.Second)
	for !slices.Contains(seen, "nrtw0") {
		if time.Now().After(deadline) {
			t.Fatalf("deletion of nrtw0 not reported; saw %v", seen)
		}
		if out, err := exec.Command("ip", "link", "add", "nrtw0", "type", "veth", "peer", "name", "nrtw1").CombinedOutput(); err != nil {
			t.Fatalf("ip link add: %v: %s", err, out)
		}
		if out, err := exec.Command("ip", "link", "del", "nrtw0").CombinedOutput(); err != nil {
			t.Fatalf("ip link del: %v: %s", err, out)
		}
		for wait := time.After(time.Second); !slices.Contains(seen, "nrtw0"); {
			select {
			case n := <-gone:
				seen = append(seen, n)
				continue
			case <-wait:
			}
			break
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("WatchLinkDeletions = %v after cancel", err)
	}
}

func TestHostInterfacesFromCache(t *testing.T) {
	requireRoot(t)
	requirePlugins(t)
	cfg := testNetwork(t)
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a := testPod(t, m, "hostifs")
	if got := m.HostInterfaces(a); got != nil {
		t.Fatalf("before ADD: %v, want nothing", got)
	}
	if _, err := m.Add(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	got := m.HostInterfaces(a)
	want := []string{cfg.DefaultBridge, hostVeth(t, m, a)}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("host interfaces %v, want %v (the bridge and the pod's veth)", got, want)
	}
}
