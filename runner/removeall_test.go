package runner

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/noderun/noderun/internal/cgroups"
)

func newIdleEngine(t *testing.T, preload ...ContainerStatus) (*Engine, *fakeRuntime, *fakeNetwork) {
	t.Helper()
	clock := newFakeClock()
	rt, net := newFakeRuntime(clock), &fakeNetwork{}
	for i := range preload {
		rt.containers[preload[i].ID] = &preload[i]
	}
	dir := t.TempDir()
	e := New(Config{
		NodeName: "n1", StateDir: filepath.Join(dir, "state"), RunDir: filepath.Join(dir, "run"),
		PodLogDir: filepath.Join(dir, "logs"), Clock: clock, Cgroups: cgroups.Layout{Root: "noderun-test-" + filepath.Base(dir)},
	}, rt, net)
	return e, rt, net
}

func TestRemoveAllStopsAndRemovesEveryPod(t *testing.T) {
	a := ContainerStatus{ID: ContainerID("a", "main", 0), PodUID: "a", PodName: "a-n1", PodNamespace: "default", Name: "main", State: StateRunning}
	b := ContainerStatus{ID: ContainerID("b", "side", 2), PodUID: "b", PodName: "b-n1", PodNamespace: "default", Name: "side", State: StateExited}
	e, rt, net := newIdleEngine(t, a, b)
	if err := e.RemoveAll(context.Background()); err != nil {
		t.Fatal(err)
	}
	rt.mu.Lock()
	left, stopped := len(rt.containers), slices.Clone(rt.stopped)
	rt.mu.Unlock()
	if left != 0 {
		t.Errorf("%d containers left", left)
	}
	if !slices.Contains(stopped, a.ID) {
		t.Errorf("running container not stopped: stopped=%v", stopped)
	}
	torn := net.tornDown()
	slices.Sort(torn)
	if !slices.Equal(torn, []string{"a", "b"}) {
		t.Errorf("networks torn down: %v, want a and b", torn)
	}
	if keep := net.lastGCKeep(); keep == nil || len(keep) != 0 {
		t.Errorf("network GC kept %v; want a GC that keeps nothing", keep)
	}
}

// A pod whose teardown keeps failing is named when the time is up, and no
// worker outlives the call.
func TestRemoveAllNamesWhatRemains(t *testing.T) {
	a := ContainerStatus{ID: ContainerID("a", "main", 0), PodUID: "a", PodName: "a-n1", PodNamespace: "default", Name: "main", State: StateRunning}
	e, _, net := newIdleEngine(t, a)
	net.tearErr = errors.New("bridge plugin failed")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := e.RemoveAll(ctx)
	if err == nil || !strings.Contains(err.Error(), "default/a-n1 (a)") {
		t.Fatalf("RemoveAll = %v; want an error naming default/a-n1", err)
	}
	if got := len(net.tornDown()); got == 0 {
		t.Fatal("teardown never tried")
	}
}
