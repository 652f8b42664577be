package runner

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/manifests"
)

// sources is what GET /manifests shows (kubeapi.StatusServer).
type sources struct {
	Sources []manifests.SourceInfo `json:"sources"`
}

func getManifests(t *testing.T, e *Engine) sources {
	t.Helper()
	return sources{Sources: e.Sources()}
}

func TestGetManifests(t *testing.T) {
	f := startEngine(t)
	pod := testPod("u1", "web", v1.RestartPolicyAlways)
	read := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	info := manifests.SourceInfo{
		Source: "file:/test", Kind: manifests.KindFile, Path: "/test",
		Files: []manifests.FileInfo{{Path: "/test/web.yaml", ReadAt: read}},
		Pods: []manifests.PodInfo{{Namespace: "default", Name: "web-n1", UID: "u1", Hash: "u1", File: "/test/web.yaml", Line: 1,
			LastKnownGood: true}},
		Errors: []string{"/test/web.yaml:9: spec.containers[0].comand: unknown field"},
	}
	f.snaps <- manifests.Snapshot{Source: "file:/test", Pods: []*v1.Pod{pod}, Info: info}
	url := manifests.SourceInfo{Source: "http:http://127.0.0.1/pods", Kind: manifests.KindURL, URL: "http://127.0.0.1/pods",
		ETag: `"v1"`, ReadAt: read, Pods: []manifests.PodInfo{}}
	f.snaps <- manifests.Snapshot{Source: url.Source, Info: url}

	var got sources
	waitFor(t, "both sources", func() bool { got = getManifests(t, f.e); return len(got.Sources) == 2 })
	b, _ := json.Marshal(got)
	want, _ := json.Marshal(sources{Sources: []manifests.SourceInfo{info, url}})
	if string(b) != string(want) {
		t.Errorf("GET /manifests:\n%s\nwant:\n%s", b, want)
	}

	// A new snapshot replaces the source's entry.
	info.Errors = nil
	f.snaps <- manifests.Snapshot{Source: "file:/test", Pods: []*v1.Pod{pod}, Info: info}
	waitFor(t, "errors gone", func() bool { return len(getManifests(t, f.e).Sources[0].Errors) == 0 })
}

// The same namespace/name from two sources runs once: the one already
// running keeps it, and the other is an error of its source.
func TestSameNameFromTwoSourcesRunsOnce(t *testing.T) {
	clock := newFakeClock()
	f := &engineFixture{rt: newFakeRuntime(clock), net: &fakeNetwork{}, clock: clock, snaps: make(chan manifests.Snapshot)}
	dir := t.TempDir()
	f.e = New(Config{NodeName: "n1", StateDir: dir + "/state", RunDir: dir + "/run", PodLogDir: dir + "/logs",
		ResolvConf: dir + "/none", Clock: clock}, f.rt, f.net)
	go f.e.Run(t.Context(), f.snaps, 2)

	fromB := testPod("uid-b", "web", v1.RestartPolicyAlways)
	f.snaps <- manifests.Snapshot{Source: "file:/b", Pods: []*v1.Pod{fromB},
		Info: manifests.SourceInfo{Source: "file:/b", Pods: []manifests.PodInfo{{Namespace: "default", Name: "web-n1", UID: "uid-b", File: "/b/web.yaml", Line: 1}}}}
	f.snaps <- manifests.Snapshot{Source: "file:/c", Info: manifests.SourceInfo{Source: "file:/c"}}
	waitFor(t, "b's pod started", func() bool { return f.rt.startedCount() == 1 })

	// A source that sorts first now defines the same name: b's keeps running.
	fromA := testPod("uid-a", "web", v1.RestartPolicyAlways)
	f.snaps <- manifests.Snapshot{Source: "file:/a", Pods: []*v1.Pod{fromA},
		Info: manifests.SourceInfo{Source: "file:/a", Pods: []manifests.PodInfo{{Namespace: "default", Name: "web-n1", UID: "uid-a", File: "/a/web.yaml", Line: 3}}}}
	var errs []string
	waitFor(t, "conflict reported", func() bool {
		for _, s := range getManifests(t, f.e).Sources {
			if s.Source == "file:/a" {
				errs = s.Errors
			}
		}
		return len(errs) > 0
	})
	if want := "/a/web.yaml:3: metadata.name: pod default/web-n1 is already defined by source file:/b"; !strings.HasPrefix(errs[0], want) {
		t.Fatalf("error %q, want it to start %q", errs[0], want)
	}
	time.Sleep(50 * time.Millisecond)
	if n := f.rt.startedCount(); n != 1 || f.status("uid-a") != nil {
		t.Fatalf("%d starts, status of a's pod %v; want only b's pod", n, f.status("uid-a"))
	}
	if calls := f.rt.callLog(); len(calls) != 0 {
		t.Fatalf("runtime calls %v; the running pod must be left alone", calls)
	}
}

// After a noderun restart no worker exists yet: the definition whose pod
// has state on disk keeps the name, whichever source answers first.
func TestSameNameFromTwoSourcesAfterARestart(t *testing.T) {
	clock := newFakeClock()
	f := &engineFixture{rt: newFakeRuntime(clock), net: &fakeNetwork{}, clock: clock, snaps: make(chan manifests.Snapshot)}
	dir := t.TempDir()
	cfg := Config{NodeName: "n1", StateDir: dir + "/state", RunDir: dir + "/run", PodLogDir: dir + "/logs",
		ResolvConf: dir + "/none", Clock: clock}
	fromB := testPod("uid-b", "web", v1.RestartPolicyAlways)
	if err := os.MkdirAll(filepath.Join(cfg.StateDir, "pods", "uid-b"), 0o700); err != nil {
		t.Fatal(err)
	}
	f.rt.containers["b-main"] = &ContainerStatus{ID: "b-main", PodUID: "uid-b", PodName: fromB.Name, PodNamespace: "default",
		Name: "main", SpecHash: specHash(&fromB.Spec.Containers[0]), State: StateRunning, PID: 42}
	f.net.adopted = map[string]bool{"uid-b": true}
	f.e = New(cfg, f.rt, f.net)
	go f.e.Run(t.Context(), f.snaps, 2)
	f.snaps <- manifests.Snapshot{Source: "file:/a", Pods: []*v1.Pod{testPod("uid-a", "web", v1.RestartPolicyAlways)}}
	f.snaps <- manifests.Snapshot{Source: "http:/b", Pods: []*v1.Pod{fromB}}
	waitFor(t, "b's pod adopted", func() bool { p := f.status("uid-b"); return p != nil && p.Status.Phase == v1.PodRunning })
	time.Sleep(50 * time.Millisecond)
	if n := f.rt.startedCount(); n != 0 || f.status("uid-a") != nil {
		t.Fatalf("%d starts, a's status %v; the pod that ran must keep the name", n, f.status("uid-a"))
	}
	if calls := f.rt.callLog(); len(calls) != 0 {
		t.Fatalf("runtime calls %v; the running pod must be left alone", calls)
	}
}
