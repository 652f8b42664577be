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

	// The subscription is set up asynchronously; add the pair only after a
	// moment so its deletion cannot be missed.
	time.Sleep(100 * time.Millisecond)
	if out, err := exec.Command("ip", "link", "add", "nrtw0", "type", "veth", "peer", "name", "nrtw1").CombinedOutput(); err != nil {
		t.Fatalf("ip link add: %v: %s", err, out)
	}
	if out, err := exec.Command("ip", "link", "del", "nrtw0").CombinedOutput(); err != nil {
		t.Fatalf("ip link del: %v: %s", err, out)
	}
	var seen []string
	timeout := time.After(30 * time.Second)
	for !slices.Contains(seen, "nrtw0") {
		select {
		case n := <-gone:
			seen = append(seen, n)
		case <-timeout:
			t.Fatalf("deletion of nrtw0 not reported; saw %v", seen)
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
