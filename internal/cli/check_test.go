package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/noderun/noderun/manifests"
)

// runCLI runs `noderun args...` in-process with the check command and
// returns stdout, stderr and the error main would exit 1 on. It runs in
// the repository's root, where the paths the tests print are short.
func runCLI(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	chdirRoot(t)
	var out, errOut bytes.Buffer
	app := &cli.App{Name: "noderun", Commands: []*cli.Command{checkCommand()}, Writer: &out, ErrWriter: &errOut}
	err = app.RunContext(context.Background(), append([]string{"noderun"}, args...))
	return out.String(), errOut.String(), err
}

func TestCheckCommand(t *testing.T) {
	chdirRoot(t)
	srv := httptest.NewServer(http.FileServer(http.Dir("manifests/testdata")))
	defer srv.Close()
	tests := []struct {
		name       string
		args       []string
		wantOut    string
		wantErrOut string
		wantFail   bool
	}{
		{
			name:    "good file",
			args:    []string{"check", "--node-name", "n1", "manifests/testdata/web.yaml"},
			wantOut: "manifests/testdata/web.yaml: OK, 2 pods (default/web-n1, default/shipper-n1)\n",
		},
		{
			name:       "unknown field, with its line",
			args:       []string{"check", "--node-name", "n1", "manifests/testdata/web.yaml", "manifests/testdata/typo.yaml"},
			wantOut:    "manifests/testdata/web.yaml: OK, 2 pods (default/web-n1, default/shipper-n1)\n",
			wantErrOut: "manifests/testdata/typo.yaml:9:5: spec.containers[0].comand: unknown field\n",
			wantFail:   true,
		},
		{
			name:    "URL, fetched once",
			args:    []string{"check", "--node-name", "n1", srv.URL + "/list.json"},
			wantOut: srv.URL + "/list.json: OK, 2 pods (edge/a-n1, default/b-n1)\n",
		},
		{
			name:    "URL with a token, shown without it",
			args:    []string{"check", "--node-name", "n1", srv.URL + "/list.json?token=s3cret"},
			wantOut: srv.URL + "/list.json?token=xxxxx: OK, 2 pods (edge/a-n1, default/b-n1)\n",
		},
		{
			name:       "URL that fails",
			args:       []string{"check", srv.URL + "/missing.yaml"},
			wantErrOut: srv.URL + "/missing.yaml: unexpected HTTP status: 404 Not Found\n",
			wantFail:   true,
		},
		{
			name:       "missing file",
			args:       []string{"check", "no/such.yaml"},
			wantErrOut: "no/such.yaml: stat " + abs(t, "no/such.yaml") + ": no such file or directory\n",
			wantFail:   true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, errOut, err := runCLI(t, tt.args...)
			if out != tt.wantOut || errOut != tt.wantErrOut {
				t.Errorf("stdout:\n%s\nstderr:\n%s\nwant stdout:\n%s\nwant stderr:\n%s", out, errOut, tt.wantOut, tt.wantErrOut)
			}
			if tt.wantFail != errors.Is(err, errCheckFailed) {
				t.Errorf("err = %v, want failure %v", err, tt.wantFail)
			}
		})
	}
}

func TestCheckCommandJSON(t *testing.T) {
	out, _, err := runCLI(t, "check", "--output", "json", "--node-name", "n1", "manifests/testdata/list.json", "manifests/testdata/typo.yaml")
	if !errors.Is(err, errCheckFailed) {
		t.Fatalf("err = %v, want errCheckFailed", err)
	}
	var got checkReport
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v in:\n%s", err, out)
	}
	want := checkError{File: "manifests/testdata/typo.yaml", Line: 9, Column: 5, Field: "spec.containers[0].comand", Message: "unknown field",
		Text: "manifests/testdata/typo.yaml:9:5: spec.containers[0].comand: unknown field"}
	if got.OK || len(got.Inputs) != 2 || len(got.Inputs[0].Pods) != 2 || got.Inputs[0].Pods[0].Name != "a-n1" ||
		len(got.Inputs[1].Errors) != 1 || got.Inputs[1].Errors[0] != want {
		t.Errorf("report:\n%s", out)
	}
}

func TestCheckCommandUsage(t *testing.T) {
	for _, args := range [][]string{{"check"}, {"check", "-o", "yaml", "x.yaml"}, {"check", "--manifest-url-header", "bad", "x.yaml"}} {
		if _, _, err := runCLI(t, args...); err == nil || errors.Is(err, errCheckFailed) {
			t.Errorf("%q: err = %v, want a usage error", args, err)
		}
	}
}

func TestPrintSources(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	sources := []manifests.SourceInfo{
		{
			Source: "file:/etc/pods", Kind: "file", Path: "/etc/pods",
			Files: []manifests.FileInfo{{Path: "/etc/pods/a.yaml", ReadAt: now.Add(-time.Hour)}, {Path: "/etc/pods/web.yaml", ReadAt: now.Add(-3 * time.Minute)}},
			Pods:  []manifests.PodInfo{{Namespace: "default", Name: "web-n1", UID: "u1", File: "/etc/pods/web.yaml", Line: 1, LastKnownGood: true}},
			Objects: []manifests.ObjectInfo{{Kind: "Secret", Namespace: "default", Name: "tls", File: "/etc/pods/web.yaml", Line: 20},
				{Kind: "ConfigMap", Namespace: "default", Name: "conf", File: "/etc/pods/a.yaml", Line: 1, LastKnownGood: true}},
			Errors: []string{"/etc/pods/web.yaml:9: spec.containers[0].comand: unknown field"},
		},
		{Source: "http:https://fleet/pods", Kind: "url", URL: "https://fleet/pods", ETag: `"v1"`, ReadAt: now.Add(-45 * time.Second),
			Pods: []manifests.PodInfo{{Namespace: "edge", Name: "db-n1", UID: "u2"}}},
		{Source: "http:https://down/pods", Kind: "url", URL: "https://down/pods", Errors: []string{"https://down/pods: connection refused"}},
	}
	var b bytes.Buffer
	printSources(&b, sources, now)
	want := `SOURCE                    READ      ETAG   PODS   ERRORS
file:/etc/pods            3m ago    -      1      1
http:https://fleet/pods   45s ago   "v1"   1      0
http:https://down/pods    never     -      0      1

POD              UID   FROM
default/web-n1   u1    /etc/pods/web.yaml:1 (last known good)
edge/db-n1       u2    https://fleet/pods

KIND        OBJECT         FROM
Secret      default/tls    /etc/pods/web.yaml:20
ConfigMap   default/conf   /etc/pods/a.yaml:1 (last known good)
error: /etc/pods/web.yaml:9: spec.containers[0].comand: unknown field
error: https://down/pods: connection refused
`
	if b.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", b.String(), want)
	}
}

// chdirRoot makes the repository's root the working directory, as it is
// for main's tests: manifests/testdata is there.
func chdirRoot(t *testing.T) {
	if _, err := os.Stat("manifests/testdata"); err != nil {
		t.Chdir("../..")
	}
}

func abs(t *testing.T, p string) string {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSuffix(wd, "/") + "/" + p
}

// Header lines from a file reach the server, for `check` as for the node.
func TestCheckHeaderFile(t *testing.T) {
	chdirRoot(t)
	var got http.Header
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Header.Clone()
		http.ServeFile(w, r, "manifests/testdata/list.json")
	}))
	defer srv.Close()
	file := filepath.Join(t.TempDir(), "headers")
	if err := os.WriteFile(file, []byte("Authorization: Bearer s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runCLI(t, "check", "--manifest-url-header-file", file, srv.URL+"/list.json"); err != nil {
		t.Fatal(err)
	}
	if got.Get("Authorization") != "Bearer s3cret" {
		t.Errorf("headers sent: %v", got)
	}
	if err := os.Chmod(file, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runCLI(t, "check", "--manifest-url-header-file", file, srv.URL+"/list.json"); !errors.Is(err, manifests.ErrHeaderFileMode) {
		t.Errorf("a mode 644 header file: %v", err)
	}
}

// An ignored field is a warning and check passes; a refused one fails it.
func TestCheckWarnsAndRefusesFields(t *testing.T) {
	dir := t.TempDir()
	write := func(name, spec string) string {
		p := dir + "/" + name
		body := "apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec:\n" + spec + "  containers:\n  - name: app\n    image: nginx:1.29\n"
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ignored := write("ignored.yaml", "  tolerations: [{operator: Exists}]\n")
	out, errOut, err := runCLI(t, "check", "--node-name", "n1", ignored)
	if err != nil || !strings.Contains(out, "OK, 1 pods") ||
		!strings.Contains(errOut, "warning: "+ignored+":5:3: spec.tolerations: ignored: the kubelet checks no taint for static pods") {
		t.Errorf("ignored field: err %v, stdout %q, stderr %q", err, out, errOut)
	}
	refused := write("refused.yaml", "  runtimeClassName: kata\n")
	_, errOut, err = runCLI(t, "check", "--node-name", "n1", refused)
	if !errors.Is(err, errCheckFailed) || !strings.Contains(errOut, refused+":5:3: spec.runtimeClassName: not supported by noderun: noderun has one runtime") {
		t.Errorf("refused field: err %v, stderr %q", err, errOut)
	}
}

// A nodeSelector or node affinity the node's labels cannot match is a
// warning, not an error: the labels may change before the pod arrives.
func TestCheckWarnsOfNodeSelector(t *testing.T) {
	file := filepath.Join(t.TempDir(), "pod.yaml")
	manifest := `apiVersion: v1
kind: Pod
metadata: {name: p}
spec:
  nodeSelector: {disk: ssd}
  containers: [{name: c, image: busybox}]
---
apiVersion: v1
kind: Pod
metadata: {name: q}
spec:
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms: [{matchExpressions: [{key: zone, operator: In, values: [a, b]}]}]
  containers: [{name: c, image: busybox}]
`
	if err := os.WriteFile(file, []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, err := runCLI(t, "check", "--node-name", "n1", file)
	if err != nil || !strings.Contains(out, "OK, 2 pods") {
		t.Fatalf("err %v, stdout %q: want OK", err, out)
	}
	for _, want := range []string{
		"warning: " + file + ":1: spec.nodeSelector: the node's labels (",
		"warning: " + file + ":8: spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution: the node's labels (",
		"kubernetes.io/hostname=n1,",
		"do not match it: the pod would be rejected at admission (NodeAffinity) unless they change (--node-labels)",
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
	if _, errOut, err := runCLI(t, "check", "--node-name", "n1", "--node-labels", "disk=ssd,zone=b", file); err != nil || errOut != "" {
		t.Errorf("with matching labels: err %v, stderr %q", err, errOut)
	}
	if _, _, err := runCLI(t, "check", "--node-labels", "kubernetes.io/role=x", file); err == nil || !strings.Contains(err.Error(), "--node-labels: unknown 'kubernetes.io'") {
		t.Errorf("a label the kubelet refuses: %v", err)
	}
}

// A pod for another OS passes the checks the API server makes and is
// rejected at admission: a warning with its file and line.
func TestCheckWarnsOfPodOS(t *testing.T) {
	file := filepath.Join(t.TempDir(), "pod.yaml")
	manifest := "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  os: {name: windows}\n  containers: [{name: c, image: busybox}]\n"
	if err := os.WriteFile(file, []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, err := runCLI(t, "check", "--node-name", "n1", file)
	if err != nil || !strings.Contains(out, "OK, 1 pod") {
		t.Fatalf("err %v, stdout %q: want OK", err, out)
	}
	if want := "warning: " + file + ":1: spec.os.name: windows: the pod would be rejected at admission (PodOSNotSupported): this node runs linux"; !strings.Contains(errOut, want) {
		t.Errorf("stderr lacks %q:\n%s", want, errOut)
	}
}

// check takes its inputs as the node's whole set: a wait-for name none of
// them defines, and a cycle across inputs, are errors with file:line.
func TestCheckWaitFor(t *testing.T) {
	dir := t.TempDir()
	pod := func(name, waitFor string) string {
		return "apiVersion: v1\nkind: Pod\nmetadata:\n  name: " + name + "\n  annotations:\n    noderun.dev/wait-for: " + waitFor +
			"\nspec:\n  containers:\n  - name: c\n    image: busybox\n"
	}
	web, db, loop := filepath.Join(dir, "web.yaml"), filepath.Join(dir, "db.yaml"), filepath.Join(dir, "loop.yaml")
	for file, content := range map[string]string{web: pod("web", "db-n1"), db: pod("db", "kube-system/dns-n1=Started"), loop: pod("db", "web-n1")} {
		if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	_, errOut, err := runCLI(t, "check", "--node-name", "n1", web, db)
	want := db + ":1: metadata.annotations[noderun.dev/wait-for]: waits for kube-system/dns-n1, which no manifest defines\n"
	if errOut != want || !errors.Is(err, errCheckFailed) {
		t.Errorf("unknown name: %q, %v; want %q", errOut, err, want)
	}
	_, errOut, err = runCLI(t, "check", "--node-name", "n1", web, loop)
	cycle := ":1: metadata.annotations[noderun.dev/wait-for]: wait-for cycle among default/db-n1, default/web-n1: none of them could ever start\n"
	if errOut != web+cycle+loop+cycle || !errors.Is(err, errCheckFailed) {
		t.Errorf("cycle: %q, %v", errOut, err)
	}
}
