package manifests

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseRollbackAfter(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    time.Duration
		wantErr string
	}{
		{in: "90s", want: 90 * time.Second},
		{in: "5m", want: 5 * time.Minute},
		{in: "1s", want: time.Second},
		{in: "168h", want: 168 * time.Hour},
		{in: "5", wantErr: `"5" is not a duration such as 90s or 5m`},
		{in: "soon", wantErr: `"soon" is not a duration`},
		{in: "500ms", wantErr: "500ms is not between 1s and 168h0m0s"},
		{in: "-1m", wantErr: "-1m is not between"},
		{in: "169h", wantErr: "169h is not between"},
	} {
		got, err := ParseRollbackAfter(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseRollbackAfter(%q) = %v, %v; want an error with %q", tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseRollbackAfter(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

// noderun check refuses a bad deadline and a pod that is meant to end,
// with file:line, and passes a good one.
func TestCheckPathRollbackAfter(t *testing.T) {
	dir := t.TempDir()
	pod := func(name, after, policy string) string {
		return "apiVersion: v1\nkind: Pod\nmetadata:\n  name: " + name + "\n  annotations:\n    noderun.dev/rollback-after: " + after +
			"\nspec:\n  restartPolicy: " + policy + "\n  containers:\n  - name: c\n    image: busybox\n"
	}
	writeFile(t, filepath.Join(dir, "good.yaml"), pod("good", "2m", "Always"))
	writeFile(t, filepath.Join(dir, "bad.yaml"), pod("bad", "2 minutes", "Always"))
	writeFile(t, filepath.Join(dir, "job.yaml"), pod("job", "30s", "OnFailure"))
	snap := CheckPath(dir, "n1")
	field := "metadata.annotations[noderun.dev/rollback-after]: "
	want := []string{
		dir + "/bad.yaml:1: " + field + `"2 minutes" is not a duration such as 90s or 5m`,
		dir + "/job.yaml:1: " + field + "needs restartPolicy Always, not OnFailure: a version is judged by its Ready condition, which a pod that ends loses",
	}
	if !reflect.DeepEqual(snap.Info.Errors, want) || len(snap.Pods) != 1 || snap.Pods[0].Name != "good-n1" {
		t.Errorf("errors:\n%s\nwant:\n%s\npods %d", strings.Join(snap.Info.Errors, "\n"), strings.Join(want, "\n"), len(snap.Pods))
	}
	if d, ok := RollbackAfter(snap.Pods[0]); !ok || d != 2*time.Minute {
		t.Errorf("RollbackAfter = %v, %t", d, ok)
	}
}
