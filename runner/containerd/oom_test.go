package containerd

import (
	"testing"
	"time"

	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/containers"

	"github.com/noderun/noderun/runner"
)

// TestOOMKilled runs a memory hog under a 32Mi limit: by the time the
// engine hears of the exit, the listed status says OOMKilled. (The shim
// publishes the OOM event some 6 ms before the exit here, the victim
// still freeing its memory.)
func TestOOMKilled(t *testing.T) {
	rt := testRuntime(t)
	exits, err := rt.Exits(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// A plain SIGKILL also exits 137, without being an OOM kill.
	killed := testConfig(t, rt, "killed", "sleep", "3600")
	startContainer(t, rt, killed)
	if err := rt.StopContainer(t.Context(), killed.ID, 0); err != nil {
		t.Fatal(err)
	}
	nextExit(t, exits, killed.ID)
	if st := containerStatus(t, rt, killed); st.OOMKilled || st.ExitCode != 137 {
		t.Fatalf("SIGKILLed container: exit %d, OOMKilled %t; want 137, not OOMKilled", st.ExitCode, st.OOMKilled)
	}

	// tail keeps its input until the last newline, which /dev/zero never sends.
	hog := testConfig(t, rt, "hog", "tail", "/dev/zero")
	hog.Resources.MemoryLimit = 32 << 20
	start := time.Now()
	startContainer(t, rt, hog)
	nextExit(t, exits, hog.ID) // the OOM event itself is no exit
	t.Logf("hog exited %v after its start began", time.Since(start))
	st := containerStatus(t, rt, hog)
	if !st.OOMKilled || st.ExitCode != 137 || st.State != runner.StateExited {
		t.Fatalf("status = exited %t, code %d, OOMKilled %t; want exited, 137, OOMKilled",
			st.State == runner.StateExited, st.ExitCode, st.OOMKilled)
	}
}

// nextExit waits for the next exit event and checks it is id's SIGKILL.
func nextExit(t *testing.T, exits <-chan runner.ExitEvent, id string) {
	t.Helper()
	select {
	case e := <-exits:
		if e.ContainerID != id || e.ExitCode != 137 {
			t.Fatalf("exit event %+v, want %s's with code 137", e, id)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("no exit event for %s", id)
	}
}

func TestStatusOfOOMKilled(t *testing.T) {
	exited := &tasktypes.Process{Status: tasktypes.Status_STOPPED, ExitStatus: 137}
	for _, tt := range []struct {
		name   string
		labels map[string]string
		want   bool
	}{
		{"labelled", map[string]string{LabelPodUID: "u", LabelOOMKilled: "true"}, true},
		{"not labelled", map[string]string{LabelPodUID: "u"}, false},
		{"other value", map[string]string{LabelPodUID: "u", LabelOOMKilled: "false"}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			st := statusOf(&containers.Container{ID: "c", Labels: tt.labels}, exited)
			if st.OOMKilled != tt.want || st.ExitCode != 137 {
				t.Fatalf("OOMKilled = %t (exit %d), want %t", st.OOMKilled, st.ExitCode, tt.want)
			}
		})
	}
}

// TestOOMKilledFromCgroup: with no event seen (noderun was down), the
// kill count the kernel keeps in the container's memory cgroup tells.
func TestOOMKilledFromCgroup(t *testing.T) {
	rt := testRuntime(t)
	hog := testConfig(t, rt, "hog", "tail", "/dev/zero")
	hog.Resources.MemoryLimit = 32 << 20
	startContainer(t, rt, hog)
	st := waitExited(t, rt, hog)
	if !st.OOMKilled || st.ExitCode != 137 {
		t.Fatalf("no exit events subscribed: exit %d, OOMKilled %t; want 137 and OOMKilled from the cgroup", st.ExitCode, st.OOMKilled)
	}
	// Recorded as a label too, so it outlives the cgroup.
	rec, err := rt.client.ContainerService().Get(rt.ctx(t.Context()), hog.ID)
	if err != nil || rec.Labels[LabelOOMKilled] != "true" {
		t.Fatalf("label %q, err %v; want it set", rec.Labels[LabelOOMKilled], err)
	}
}
