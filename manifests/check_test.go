package manifests

import (
	"path/filepath"
	"testing"
)

func TestCheckPath(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.yaml")
	tests := []struct {
		path string
		want string
	}{
		{"testdata/web.yaml", "web-n1 docker.io/library/busybox:1.36\nshipper-n1 docker.io/library/busybox:1.36\n"},
		{"testdata/list.json", "a-n1 busybox:1.36\nb-n1 busybox:1.36\n"},
		{"testdata/typo.yaml", "error testdata/typo.yaml:9:5: spec.containers[0].comand: unknown field\n"},
		{missing, "error " + missing + ": stat " + missing + ": no such file or directory\n"},
	}
	for _, tt := range tests {
		if got := summary(CheckPath(tt.path, "n1")); got != tt.want {
			t.Errorf("CheckPath(%s):\n%s\nwant:\n%s", tt.path, got, tt.want)
		}
	}
	// A directory counts as a source would count it.
	snap := CheckPath("testdata", "n1")
	if len(snap.Pods) != 4 || len(snap.Info.Files) != 3 || len(snap.Info.Errors) != 1 ||
		snap.Info.Errors[0] != "testdata/typo.yaml:9:5: spec.containers[0].comand: unknown field" ||
		snap.Info.Pods[0].File != "testdata/list.json" {
		t.Errorf("testdata: %d pods, %d files, info %+v", len(snap.Pods), len(snap.Info.Files), snap.Info)
	}
}
