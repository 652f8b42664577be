package main

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/noderun/noderun/internal/testenv"
	"github.com/noderun/noderun/internal/testnode"
)

// TestSmoke runs the whole harness at its smallest (2 pods, 1 repetition)
// so it keeps working; the figures are not checked against targets, only
// for being there, and everything it started must be gone afterwards.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts containerd, noderun and pods; skipped with -short")
	}
	m := missingPrerequisite()
	testenv.Require(t, m == "", m)
	cfg := Config{
		Runs: 1, BurstRuns: 1, InitRuns: 1, Bursts: []int{2}, CPUWindow: time.Second, LogWindow: time.Second, APIGets: 2, ProbePods: 2, ShimPods: 2, ShimContainers: 2, ImageTarballs: 2, ImageTarballMiB: 1,
		// Not the default network, so a `make bench` may run meanwhile.
		Bridge: "nrbsmoke0", Subnet: "10.214.0.0/24", Log: testLog{t},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	rep, err := run(ctx, cfg)
	if rep != nil {
		checkCleanedUp(t, rep, cfg.Bridge, nodeBridgeName(cfg.Bridge))
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Rows) == 0 {
		t.Fatal("no rows")
	}
	for _, r := range rep.Rows {
		if r.Noderun == nil || len(r.Noderun.Samples) == 0 {
			t.Errorf("%s: no noderun figure", r.Key)
			continue
		}
		// A steady state's CPU over one second may well round to zero
		// ticks (a burst's start does not); the logging two pods add may
		// be within the noise of the collector's heap.
		idleCPU := strings.HasSuffix(r.Key, "_cpu") && !strings.HasPrefix(r.Key, "burst_")
		if !idleCPU && !strings.HasPrefix(r.Key, "pss_logging_per_container_") && !(r.Noderun.Min > 0) {
			t.Errorf("%s: noderun %+v, want > 0", r.Key, r.Noderun)
		}
		if r.Floor != nil && !(r.Floor.Min > 0) {
			t.Errorf("%s: floor %+v, want > 0", r.Key, r.Floor)
		}
	}
	path := filepath.Join(t.TempDir(), "smoke.json")
	if err := rep.writeJSON(path); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b, &back); err != nil || len(back.Rows) != len(rep.Rows) {
		t.Errorf("JSON does not round-trip: %v, %d rows", err, len(back.Rows))
	}
	rep.writeTable(testLog{t})
}

func checkCleanedUp(t *testing.T, rep *Report, bridges ...string) {
	t.Helper()
	if _, err := os.Stat(rep.dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("bench dir %s left behind: %v", rep.dir, err)
	}
	if _, err := os.Stat(rep.dir + ".img"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the bench dir's filesystem image left behind: %v", err)
	}
	procs, err := testnode.Processes()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		if len(p.Args) > 0 && strings.HasPrefix(p.Args[0], rep.dir+"/") {
			t.Errorf("process %d still runs the bench's binary: %q", p.PID, p.Args)
		}
	}
	if err := syscall.Kill(rep.containerdPID, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("containerd (pid %d) still runs: %v", rep.containerdPID, err)
	}
	for _, bridge := range bridges {
		if _, err := net.InterfaceByName(bridge); err == nil {
			t.Errorf("bridge %s left behind", bridge)
		}
	}
	ms, err := testnode.MountsUnder("/")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if strings.HasPrefix(m.Point, rep.dir+"/") {
			t.Errorf("mount left: %s", m.Point)
		}
		if m.FSType == "cgroup" || m.FSType == "cgroup2" {
			if _, err := os.Stat(filepath.Join(m.Point, floorCgroup(rep.dir))); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("floor cgroup left in %s: %v", m.Point, err)
			}
		}
	}
}

// testLog sends the harness's progress to the test log.
type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func TestHalves(t *testing.T) {
	for _, tc := range []struct{ in, lo, hi string }{
		{"10.213.0.0/16", "10.213.0.0/17", "10.213.128.0/17"},
		{"10.214.0.0/24", "10.214.0.0/25", "10.214.0.128/25"},
		{"10.214.0.77/24", "10.214.0.0/25", "10.214.0.128/25"},
	} {
		lo, hi, err := halves(tc.in)
		if err != nil || lo != tc.lo || hi != tc.hi {
			t.Errorf("halves(%s) = %s, %s, %v; want %s, %s", tc.in, lo, hi, err, tc.lo, tc.hi)
		}
	}
	for _, bad := range []string{"10.0.0.0/30", "fd00::/64", "x"} {
		if _, _, err := halves(bad); err == nil {
			t.Errorf("halves(%s) succeeded", bad)
		}
	}
}
