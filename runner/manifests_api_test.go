package runner

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/manifests"
)

func getManifests(t *testing.T, e *Engine) ManifestSources {
	t.Helper()
	rec := httptest.NewRecorder()
	e.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/manifests", nil))
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("GET /manifests: %d %s", rec.Code, rec.Body)
	}
	var out ManifestSources
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		t.Fatal(err)
	}
	return out
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

	var got ManifestSources
	waitFor(t, "both sources", func() bool { got = getManifests(t, f.e); return len(got.Sources) == 2 })
	b, _ := json.Marshal(got)
	want, _ := json.Marshal(ManifestSources{Sources: []manifests.SourceInfo{info, url}})
	if string(b) != string(want) {
		t.Errorf("GET /manifests:\n%s\nwant:\n%s", b, want)
	}

	// A new snapshot replaces the source's entry.
	info.Errors = nil
	f.snaps <- manifests.Snapshot{Source: "file:/test", Pods: []*v1.Pod{pod}, Info: info}
	waitFor(t, "errors gone", func() bool { return len(getManifests(t, f.e).Sources[0].Errors) == 0 })
}
