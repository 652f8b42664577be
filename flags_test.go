package main

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Every flag is read and checked before noderun connects to containerd: a
// bad one fails at once, and nothing dials the containerd address (before
// nodeConfigFrom, four of these failed only once containerd answered).
func TestBadFlagFailsBeforeContainerd(t *testing.T) {
	dir, err := os.MkdirTemp("/tmp", "nrf") // a unix socket's path is short
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "containerd.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var dialed atomic.Int32
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			dialed.Add(1)
			c.Close()
		}
	}()
	for _, bad := range [][]string{
		{"--image-pull-fallback", "sometimes"},
		{"--image-gc-low-threshold", "90"}, // above the high threshold
		{"--container-log-max-size", "lots"},
		{"--container-log-max-files", "1"},
		{"--cgroup-driver", "upstart"},
		{"--api-port", "70000"},
		{"--healthz-port", "-1"},
		{"--crashloop-max-backoff", "999ms"},
		{"--crashloop-max-backoff", "301s"},
		{"--memory-swap-behavior", "UnlimitedSwap"},
		{"--shim-groups", "-1"},
		{"--shim-groups", "65"},
		{"--manifest-url-header", "no colon"},
		{"--log-level", "loud"},
		{"--shutdown-grace-period", "-1s"},
		{"--shutdown-grace-period-critical-pods", "20s", "--shutdown-grace-period", "10s"}, // more than the whole
	} {
		t.Run(bad[0], func(t *testing.T) {
			// Bounded, so a regression (noderun waiting for the fake
			// containerd) fails rather than hangs.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			run := t.TempDir()
			args := []string{"noderun", "--state-dir", filepath.Join(run, "state"), "--run-dir", filepath.Join(run, "run"),
				"--pod-log-dir", filepath.Join(run, "logs"), "--manifests", t.TempDir(), "--containerd-address", sock,
				"--api-port", "0", "--log-level", "error"}
			err := newApp().RunContext(ctx, append(args, bad...))
			if err == nil || !strings.Contains(err.Error(), bad[0]) {
				t.Fatalf("err = %v, want one naming %s", err, bad[0])
			}
			if n := dialed.Load(); n > 0 {
				t.Fatalf("containerd's address dialed %d times before the bad flag was found", n)
			}
		})
	}
}

// The node's Ready message is the kubelet's aggregate of what keeps it
// from being Ready.
func TestReadyErrors(t *testing.T) {
	down := errors.New("node is shutting down")
	for _, tc := range []struct {
		errs []error
		want string
	}{
		{nil, ""},
		{[]error{nil, down}, "node is shutting down"},
		{[]error{errors.New("containerd: unavailable"), down}, "[containerd: unavailable, node is shutting down]"},
	} {
		got := readyErrors(tc.errs...)
		if (got == nil) != (tc.want == "") || got != nil && got.Error() != tc.want {
			t.Errorf("readyErrors(%v) = %v, want %q", tc.errs, got, tc.want)
		}
	}
}
