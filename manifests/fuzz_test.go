package manifests

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
)

// FuzzDecode feeds arbitrary bytes through what a source does with a file:
// decode, default, validate. Nothing may panic, every problem must be a
// *ManifestError on a line of the input, and an accepted pod must survive
// defaulting twice unchanged. The seed corpus (conformance manifests,
// testdata) runs in plain `go test`.
func FuzzDecode(f *testing.F) {
	for _, pattern := range []string{filepath.Join(conformanceDir, "*.yaml"), "testdata/*.yaml", "testdata/*.json"} {
		files, _ := filepath.Glob(pattern)
		for _, file := range files {
			data, err := os.ReadFile(file)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(data)
		}
	}
	f.Add([]byte("--- {apiVersion: v1, kind: Pod, metadata: {name: a}}\n---\n"))
	f.Add([]byte("apiVersion: v1\nkind: PodList\nitems: [{kind: Service}]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		lines := bytes.Count(data, []byte("\n")) + 1
		docs, errs := decodeDocuments(data)
		for _, d := range docs {
			ApplyDefaults(d.pod)
			errs = append(errs, Validate(d.pod)...)
			before := d.pod.DeepCopy()
			ApplyDefaults(d.pod)
			if !equality.Semantic.DeepEqual(before, d.pod) {
				t.Errorf("defaulting twice changed the pod")
			}
		}
		for _, err := range errs {
			var me *ManifestError
			if !errors.As(err, &me) {
				t.Fatalf("%v is not a *ManifestError", err)
			}
			if me.Line < 0 || me.Line > lines {
				t.Errorf("%v: line %d outside the input's %d lines", err, me.Line, lines)
			}
		}
	})
}
