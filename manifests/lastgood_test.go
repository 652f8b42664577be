package manifests

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// staleSummary is summary with a "(last good)" mark on kept pods.
func staleSummary(s Snapshot) string {
	var b strings.Builder
	for i, p := range s.Pods {
		mark := ""
		if s.Info.Pods[i].LastKnownGood {
			mark = " (last good)"
		}
		fmt.Fprintf(&b, "%s %s%s\n", p.Name, p.Spec.Containers[0].Image, mark)
	}
	for _, err := range s.Errors {
		fmt.Fprintf(&b, "error %s\n", err)
	}
	return b.String()
}

// newTestRun is a fileRun without a watcher: each step is relistAll, then
// snapshot, with no timing involved.
func newTestRun(dir string, log *slog.Logger) *fileRun {
	return &fileRun{FileSource: NewFileSource(dir, "node1", WithLogger(log)), files: map[string]*fileResult{}, readAsIs: true}
}

func TestFileSourceLastKnownGood(t *testing.T) {
	dir := t.TempDir()
	web := filepath.Join(dir, "web.yaml")
	never := filepath.Join(dir, "never.yaml")
	steps := []struct {
		name  string
		write map[string]string // path -> content; "" removes
		want  string
	}{
		{
			name:  "valid",
			write: map[string]string{web: manifest("web", "nginx:1") + "---\n" + manifest("db", "pg:1")},
			want:  "web-node1 nginx:1\ndb-node1 pg:1\n",
		},
		{
			name: "one document invalid: it keeps its last good spec, the other takes its new one",
			write: map[string]string{web: strings.Replace(manifest("web", "nginx:2"), "image", "imag", 1) +
				"---\n" + manifest("db", "pg:2")},
			want: "db-node1 pg:2\nweb-node1 nginx:1 (last good)\n" +
				"error " + web + ":8:5: spec.containers[0].imag: unknown field\n",
		},
		{
			name:  "whole file unparsable: everything kept",
			write: map[string]string{web: "apiVersion: v1\nkind: [Pod\n"},
			want: "db-node1 pg:2 (last good)\nweb-node1 nginx:1 (last good)\n" +
				"error " + web + ":2: invalid YAML: line 2: did not find expected ',' or ']'\n",
		},
		{
			name:  "too large: everything kept",
			write: map[string]string{web: "#" + strings.Repeat("x", MaxFileSize)},
			want: "db-node1 pg:2 (last good)\nweb-node1 nginx:1 (last good)\n" +
				"error " + web + ": manifest file is larger than 10 MiB\n",
		},
		{
			name:  "a pod that was never valid never starts",
			write: map[string]string{never: strings.Replace(manifest("never", "nginx"), "image: nginx", "image: ''", 1)},
			want: "db-node1 pg:2 (last good)\nweb-node1 nginx:1 (last good)\n" +
				"error " + never + ":8:5: spec.containers[0].image: required\n" +
				"error " + web + ": manifest file is larger than 10 MiB\n",
		},
		{
			name:  "valid again: the new content stands, db is gone",
			write: map[string]string{web: manifest("web", "nginx:3"), never: ""},
			want:  "web-node1 nginx:3\n",
		},
		{
			name:  "broken, then removed: the pods go",
			write: map[string]string{web: "kind: ["},
			want:  "web-node1 nginx:3 (last good)\nerror " + web + ":1: invalid YAML: line 1: did not find expected node content\n",
		},
		{
			name:  "removed",
			write: map[string]string{web: ""},
			want:  "",
		},
	}
	r := newTestRun(dir, slog.New(slog.DiscardHandler))
	for _, st := range steps {
		for path, content := range st.write {
			if content == "" {
				os.Remove(path)
			} else {
				writeFile(t, path, content)
			}
		}
		r.relistAll()
		snap, _ := r.snapshot()
		if got := staleSummary(snap); got != st.want {
			t.Fatalf("%s:\n%s\nwant:\n%s", st.name, got, st.want)
		}
	}
}

// Whatever the number of re-lists, a change is logged once.
func TestFileSourceLogsOncePerChange(t *testing.T) {
	dir := t.TempDir()
	var logs bytes.Buffer
	r := newTestRun(dir, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{ReplaceAttr: dropTime})))
	out := make(chan Snapshot, 1)
	step := func(write func()) string {
		t.Helper()
		logs.Reset()
		write()
		for range 3 {
			r.relistAll()
			r.send(context.Background(), out, false)
			select {
			case <-out:
			default:
			}
		}
		return logs.String()
	}
	web, bad := filepath.Join(dir, "web.yaml"), filepath.Join(dir, "bad.yaml")
	src := "source=file:" + dir
	tests := []struct {
		name  string
		write func()
		want  string
	}{
		{"add", func() { writeFile(t, web, manifest("web", "nginx:1")) },
			"level=INFO msg=\"pod added\" " + src + " pod=default/web-node1 uid=UID\n"},
		{"error", func() { writeFile(t, bad, "kind: Deployment\napiVersion: v1\n") },
			"level=WARN msg=\"manifest error\" " + src + " err=\"" + bad + ":1: kind: unsupported kind \\\"Deployment\\\" (want Pod or PodList)\"\n"},
		{"update", func() { writeFile(t, web, manifest("web", "nginx:2")) },
			"level=INFO msg=\"pod updated\" " + src + " pod=default/web-node1 uid=UID\n"},
		{"nothing", func() {}, ""},
		{"fix and remove", func() { os.Remove(bad); os.Remove(web) },
			"level=INFO msg=\"pod removed\" " + src + " pod=default/web-node1 uid=UID\n" +
				"level=INFO msg=\"manifest error resolved\" " + src + " err=\"" + bad + ":1: kind: unsupported kind \\\"Deployment\\\" (want Pod or PodList)\"\n"},
	}
	for _, tt := range tests {
		got := uidRE.ReplaceAllString(step(tt.write), "uid=UID")
		if got != tt.want {
			t.Errorf("%s: logged\n%s\nwant\n%s", tt.name, got, tt.want)
		}
	}
}

func dropTime(_ []string, a slog.Attr) slog.Attr {
	if a.Key == slog.TimeKey {
		return slog.Attr{}
	}
	return a
}

var uidRE = regexp.MustCompile(`uid=[0-9a-f]{32}`)
