package containerd

import (
	"slices"
	"testing"
	"time"

	"github.com/noderun/noderun/runner"
)

func TestWithShimGroup(t *testing.T) {
	for _, tc := range []struct {
		name string
		sb   *runner.Sandbox
		want string
	}{
		{"pod sandbox", &runner.Sandbox{ID: "0a1b2c-web", Epoch: "e1"}, "0a1b2c-web-e1"},
		{"no sandbox", nil, ""},
		{"no epoch", &runner.Sandbox{ID: "0a1b2c-web"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := genSpec(t, withShimGroup(tc.sb)).Annotations[shimGroupAnnotation]; got != tc.want {
				t.Errorf("group %q, want %q", got, tc.want)
			}
		})
	}
}

// groupShim is the pid of the shim serving the sandbox's group.
func groupShim(t *testing.T, d *Daemon, sb *runner.Sandbox) int {
	t.Helper()
	return shimListeningOn(t, d.Address(), testNamespace, shimSocket(d.Address(), testNamespace, sb.ID+"-"+sb.Epoch))
}

// The containers of one sandbox share one shim, which outlives the
// container it was started for while a sibling's task exists, and ends
// with the last one. Meanwhile each container still stops with its grace
// period, runs execs, reports its own OOM kill and exit, and a replacement
// joins the running shim; the shim is never taken for a stray one.
func TestGroupedPodSharesOneShim(t *testing.T) {
	rt, d := testRuntimeDaemon(t)
	exits, err := rt.Exits(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	first := testConfig(t, rt, "first", "sh", "-c", "trap 'exit 7' TERM; while :; do sleep 1; done")
	first.Sandbox.Epoch = "e1"
	sb := first.Sandbox
	startContainer(t, rt, first)
	shim := groupShim(t, d, sb)
	// sibling is another container of first's pod.
	sibling := func(name string, args ...string) *runner.ContainerConfig {
		cfg := testConfig(t, rt, name, args...)
		cfg.Sandbox, cfg.Pod, cfg.Container, cfg.CgroupParent = sb, first.Pod, first.Container, first.CgroupParent
		return cfg
	}

	second := sibling("second", "sleep", "3600")
	startContainer(t, rt, second)
	hog := sibling("hog", "tail", "/dev/zero")
	hog.Resources.MemoryLimit = 32 << 20
	startContainer(t, rt, hog)
	other := testConfig(t, rt, "other", "sleep", "3600")
	other.Sandbox.Epoch = "e1"
	startContainer(t, rt, other)

	if got := groupShim(t, d, sb); got != shim {
		t.Fatalf("second container's shim %d, want the pod's %d", got, shim)
	}
	if groupShim(t, d, other.Sandbox) == shim {
		t.Fatal("another pod's container shares the shim")
	}
	nextExit(t, exits, hog.ID)
	if st := containerStatus(t, rt, hog); !st.OOMKilled || st.ExitCode != 137 {
		t.Fatalf("hog: exit %d, OOMKilled %t; want 137, OOMKilled", st.ExitCode, st.OOMKilled)
	}

	// The container the shim was started for stops by its own signal and
	// is removed; its siblings' tasks keep the shim.
	if err := rt.StopContainer(t.Context(), first.ID, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-exits:
		if e.ContainerID != first.ID || e.ExitCode != 7 {
			t.Fatalf("exit %+v, want %s's with code 7 (its TERM trap)", e, first.ID)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no exit event for the first container")
	}
	if err := rt.RemoveContainer(t.Context(), first.ID); err != nil {
		t.Fatal(err)
	}
	if !alive(shim) {
		t.Fatal("the pod's shim ended with the container it was started for")
	}
	if n, err := ReapStrayShims(t.Context(), rt.client, d.Address(), testNamespace, testLogger(t)); err != nil || n != 0 {
		t.Fatalf("reaping killed %d shims (%v), want none: the pod's shim serves its other containers", n, err)
	}
	if st := containerStatus(t, rt, second); st.State != runner.StateRunning {
		t.Fatalf("second container in state %v after the first was removed", st.State)
	}
	if res := execSync(t, rt, second.ID, 10*time.Second, "echo", "still here"); string(res.Output) != "still here\n" {
		t.Fatalf("exec in the second container: %q", res.Output)
	}

	// A replacement joins the running shim.
	replacement := sibling("replacement", "sleep", "3600")
	startContainer(t, rt, replacement)
	if got := groupShim(t, d, sb); got != shim {
		t.Fatalf("replacement's shim %d, want the pod's %d", got, shim)
	}

	for _, cfg := range []*runner.ContainerConfig{second, hog, replacement} {
		if err := rt.RemoveContainer(t.Context(), cfg.ID); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); alive(shim); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the pod's shim still runs after its last task was deleted")
		}
	}
	if shims, _ := findShims(canonicalAddress(d.Address()), testNamespace); slices.ContainsFunc(shims, func(s shimProc) bool { return s.pid == shim }) {
		t.Fatal("the pod's shim is still listed")
	}
}
