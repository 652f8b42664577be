package cni

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"golang.org/x/sys/unix"
)

// shortBounds makes a Manager give up quickly, as its defaults would on a
// plugin or lock that never answers.
var shortBounds = timeouts{op: 300 * time.Millisecond, check: 300 * time.Millisecond, lock: 300 * time.Millisecond}

// bounded fails the test unless fn returns within limit, and returns its
// error and how long it took.
func bounded(t *testing.T, limit time.Duration, fn func() error) (error, time.Duration) {
	t.Helper()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case err := <-done:
		return err, time.Since(start)
	case <-time.After(limit):
		t.Fatalf("still waiting after %s", limit)
		return nil, 0
	}
}

// TestPluginTimeout hangs the plugin in each command: the call fails with
// the deadline instead of waiting for it.
func TestPluginTimeout(t *testing.T) {
	ctx := context.Background()
	m, rec := fakeNetwork(t, "1.0.0")
	a := Attachment{ID: "nrt-hang", NetNS: fakeNetNS}
	// With the default bounds: on a busy machine a plugin that does not
	// hang may take longer than the short ones.
	if _, err := m.Add(ctx, a); err != nil {
		t.Fatal(err)
	}
	m.bounds = shortBounds
	for _, cmd := range []string{"CHECK", "DEL", "ADD"} {
		t.Run(cmd, func(t *testing.T) {
			hang := filepath.Join(rec, "hang-"+cmd)
			writeFiles(t, rec, map[string]string{filepath.Base(hang): ""})
			defer os.Remove(hang)
			err, took := bounded(t, 10*time.Second, func() error {
				switch cmd {
				case "CHECK":
					return m.Check(ctx, a)
				case "DEL":
					return m.Del(ctx, a)
				}
				_, err := m.Add(ctx, a)
				return err
			})
			t.Logf("%s gave up after %s", cmd, took.Round(time.Millisecond))
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%s = %v, want a deadline error", cmd, err)
			}
			if errors.Is(err, ErrCheckFailed) {
				t.Errorf("a CHECK that timed out says the pod is broken: %v", err)
			}
		})
	}
}

// TestGCLeaseLockTimeout holds host-local's lock of the network's lease dir,
// as a hung plugin would: GC gives up on that dir instead of waiting.
func TestGCLeaseLockTimeout(t *testing.T) {
	m, _ := fakeNetwork(t, "1.0.0")
	m.bounds = shortBounds
	dir := leaseDirs([]*libcni.NetworkConfigList{m.lastList()})[0].path
	writeFiles(t, dir, nil)
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// Another open file description of the lock conflicts like another
	// process would.
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	err, took := bounded(t, 10*time.Second, func() error {
		_, err := m.GC(context.Background(), nil)
		return err
	})
	t.Logf("GC gave up after %s", took.Round(time.Millisecond))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("GC = %v, want a deadline error", err)
	}
}

// TestGCIPTablesTimeout puts an iptables that records its arguments and then
// hangs first in PATH: GC's nat sweep gives up, and it asked iptables to
// wait for the xtables lock for a bounded time only.
func TestGCIPTablesTimeout(t *testing.T) {
	m, _ := fakeNetwork(t, "1.0.0")
	m.bounds = shortBounds
	bin, args := t.TempDir(), filepath.Join(t.TempDir(), "args")
	script := fmt.Sprintf("#!/bin/sh\necho \"$@\" >> %s\nexec sleep 600\n", args)
	writeFiles(t, bin, map[string]string{"iptables": script, "ip6tables": script})
	for _, b := range []string{"iptables", "ip6tables"} {
		if err := os.Chmod(filepath.Join(bin, b), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	// Left by a crash mid-ADD: recorded, nothing cached.
	if err := m.owned.add("fake", "nrt-left"); err != nil {
		t.Fatal(err)
	}
	err, took := bounded(t, 10*time.Second, func() error {
		_, err := m.GC(context.Background(), nil)
		return err
	})
	t.Logf("GC gave up after %s", took.Round(time.Millisecond))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("GC = %v, want a deadline error", err)
	}
	data, err := os.ReadFile(args)
	if err != nil {
		t.Fatal(err)
	}
	if first := strings.Fields(strings.SplitN(string(data), "\n", 2)[0]); !slices.Equal(first[:2], []string{"-w", xtablesWait}) {
		t.Errorf("iptables called with %q, want -w %s first", first, xtablesWait)
	}
	if owners, _ := m.owned.owners(); len(owners) != 1 {
		t.Errorf("ledger = %v; a failed sweep must leave the ID recorded", owners)
	}
}
