package cgroups

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/noderun/noderun/internal/testenv"
)

const sandbox = "0123456789abcdef0123456789abcdef"

// layouts are the four a host can have: both drivers on v1 (hybrid
// included) and on the unified v2 hierarchy.
func layouts(fs string) map[string]Layout {
	return map[string]Layout{
		"cgroupfs v1": {Driver: Cgroupfs, FS: fs},
		"cgroupfs v2": {Driver: Cgroupfs, Unified: true, FS: fs},
		"systemd v1":  {Driver: Systemd, FS: fs},
		"systemd v2":  {Driver: Systemd, Unified: true, FS: fs},
	}
}

func TestPaths(t *testing.T) {
	type want struct{ parent, cgroupsPath, memoryDir, podDir, guaranteed, bestEffort string }
	tests := map[string]want{
		"cgroupfs v1": {"/noderun/burstable/pod" + sandbox, "/noderun/burstable/pod" + sandbox + "/ctr",
			"/sys/fs/cgroup/memory/noderun/burstable/pod" + sandbox + "/ctr", "/sys/fs/cgroup/cpu/noderun/burstable/pod" + sandbox,
			"/noderun/pod" + sandbox, "/noderun/besteffort/pod" + sandbox},
		"cgroupfs v2": {"/noderun/burstable/pod" + sandbox, "/noderun/burstable/pod" + sandbox + "/ctr",
			"/sys/fs/cgroup/noderun/burstable/pod" + sandbox + "/ctr", "/sys/fs/cgroup/noderun/burstable/pod" + sandbox,
			"/noderun/pod" + sandbox, "/noderun/besteffort/pod" + sandbox},
		"systemd v1": {"noderun-burstable-pod" + sandbox + ".slice", "noderun-burstable-pod" + sandbox + ".slice:noderun:ctr",
			"/sys/fs/cgroup/memory/noderun.slice/noderun-burstable.slice/noderun-burstable-pod" + sandbox + ".slice/noderun-ctr.scope",
			"/sys/fs/cgroup/cpu/noderun.slice/noderun-burstable.slice/noderun-burstable-pod" + sandbox + ".slice",
			"noderun-pod" + sandbox + ".slice", "noderun-besteffort-pod" + sandbox + ".slice"},
		"systemd v2": {"noderun-burstable-pod" + sandbox + ".slice", "noderun-burstable-pod" + sandbox + ".slice:noderun:ctr",
			"/sys/fs/cgroup/noderun.slice/noderun-burstable.slice/noderun-burstable-pod" + sandbox + ".slice/noderun-ctr.scope",
			"/sys/fs/cgroup/noderun.slice/noderun-burstable.slice/noderun-burstable-pod" + sandbox + ".slice",
			"noderun-pod" + sandbox + ".slice", "noderun-besteffort-pod" + sandbox + ".slice"},
	}
	for name, l := range layouts("") {
		w := tests[name]
		parent := l.PodParent(Burstable, sandbox)
		path := l.ContainerPath(parent, "ctr")
		got := want{parent, path, l.Dir(path, "memory"), l.Dir(parent, "cpu"), l.PodParent(Guaranteed, sandbox), l.PodParent(BestEffort, sandbox)}
		if got != w {
			t.Errorf("%s:\n got %+v\nwant %+v", name, got, w)
		}
	}
}

// A container keeps the cgroup it was made with when the driver changes.
func TestPathFollowsTheForm(t *testing.T) {
	fs, sd := Layout{Driver: Cgroupfs}, Layout{Driver: Systemd}
	if got := fs.Path("noderun-pod1.slice:noderun:c"); got != "/noderun.slice/noderun-pod1.slice/noderun-c.scope" {
		t.Errorf("systemd path under cgroupfs: %q", got)
	}
	if got := sd.Path("/noderun/pod1/c"); got != "/noderun/pod1/c" {
		t.Errorf("cgroupfs path under systemd: %q", got)
	}
}

func TestExpandSlice(t *testing.T) {
	for in, want := range map[string]string{
		"-.slice":            "/",
		"noderun.slice":      "/noderun.slice",
		"noderun-pod1.slice": "/noderun.slice/noderun-pod1.slice",
		"a-b-c.slice":        "/a.slice/a-b.slice/a-b-c.slice",
	} {
		if got := expandSlice(in); got != want {
			t.Errorf("expandSlice(%q) = %q, want %q", in, got, want)
		}
	}
}

// The OOM kill count is read where each layout keeps it: memory.oom_control
// in the v1 memory hierarchy, memory.events in the unified one.
func TestOOMKills(t *testing.T) {
	for name, l := range layouts(t.TempDir()) {
		path := l.ContainerPath(l.PodParent(Guaranteed, sandbox), "ctr")
		if _, ok := l.OOMKills(path); ok {
			t.Errorf("%s: a count without a cgroup", name)
		}
		file, content := "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"
		if l.Unified {
			file, content = "memory.events", "low 0\nhigh 0\nmax 5\noom 1\noom_kill 2\n"
		}
		dir := l.Dir(path, "memory")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, file), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if n, ok := l.OOMKills(path); !ok || n != 2 {
			t.Errorf("%s: %d %t, want 2 from %s", name, n, ok, filepath.Join(dir, file))
		}
	}
}

// With systemd the pod's slice is stopped, as the kubelet stops it; the
// root slice only once it exists and no pod slice is left in it.
func TestSystemdRemovesBySlice(t *testing.T) {
	var stopped []string
	fs := t.TempDir()
	l := Layout{Driver: Systemd, Unified: true, FS: fs, StopUnit: func(_ context.Context, name string) error {
		stopped = append(stopped, name)
		return nil
	}}
	// The hierarchy is a plain dir here: fake the cgroup2 mount list.
	cgroupMounts = func() []string { return []string{fs} }
	t.Cleanup(func() { cgroupMounts = readCgroupMounts })
	parent := l.PodParent(Guaranteed, sandbox)
	ctx := context.Background()
	if err := l.RemoveRoot(ctx); err != nil || len(stopped) != 0 {
		t.Fatalf("RemoveRoot with no root slice: %v, stopped %q; want nothing stopped", err, stopped)
	}
	podDir := l.Dir(parent, "")
	if err := os.MkdirAll(podDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := l.RemoveRoot(ctx); err != nil || len(stopped) != 0 {
		t.Fatalf("RemoveRoot with a pod slice left: %v, stopped %q; want nothing stopped", err, stopped)
	}
	if err := l.RemovePod(ctx, parent); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(podDir); err != nil { // what systemd does when it stops the slice
		t.Fatal(err)
	}
	if err := l.RemoveRoot(ctx); err != nil {
		t.Fatal(err)
	}
	if want := []string{parent, "noderun.slice"}; !slices.Equal(stopped, want) {
		t.Fatalf("stopped %q, want %q", stopped, want)
	}
}

// With cgroupfs the pod's directory goes from every hierarchy, here real
// ones (the test needs root to make cgroups).
func TestCgroupfsRemovesDirs(t *testing.T) {
	if testing.Short() {
		t.Skip("makes cgroups; skipped with -short")
	}
	testenv.Require(t, os.Geteuid() == 0, "root")
	l := Layout{Driver: Cgroupfs, Root: "noderun-test-" + filepath.Base(t.TempDir())}
	parent := l.PodParent(Burstable, sandbox)
	var made []string
	for _, h := range l.hierarchies() {
		d := filepath.Join(h, parent)
		if err := os.MkdirAll(d, 0o755); err == nil {
			made = append(made, d)
		}
	}
	testenv.Require(t, len(made) > 0, "a writable cgroup hierarchy")
	// Another pod (another noderun's) still in the root: it stays, no error.
	if err := l.RemoveRoot(context.Background()); err != nil {
		t.Fatalf("RemoveRoot with a pod in it: %v", err)
	}
	if _, err := os.Stat(made[0]); err != nil {
		t.Fatalf("pod cgroup gone with the root: %v", err)
	}
	if err := l.RemovePod(context.Background(), parent); err != nil {
		t.Fatal(err)
	}
	if err := l.RemoveRoot(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, d := range made {
		for _, up := range []string{filepath.Dir(d), filepath.Dir(filepath.Dir(d))} { // the tier, the root
			if _, err := os.Stat(up); !os.IsNotExist(err) {
				t.Errorf("%s: %v, want removed with its pod dir", up, err)
			}
		}
	}
}

func TestParseDriver(t *testing.T) {
	for in, ok := range map[string]bool{"cgroupfs": true, "systemd": true, "": false, "Systemd": false} {
		if _, err := ParseDriver(in); (err == nil) != ok {
			t.Errorf("ParseDriver(%q): %v", in, err)
		}
	}
}

func TestParseRoot(t *testing.T) {
	for in, ok := range map[string]bool{"noderun": true, "e2e_1": true, "": false, "a-b": false, "a/b": false, "..": false} {
		if _, err := ParseRoot(in); (err == nil) != ok {
			t.Errorf("ParseRoot(%q): %v", in, err)
		}
	}
}
