package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The kubelet's node log query through kubectl get --raw, with the admin
// token, from a log directory of the test's own (--node-log-dir): a file,
// the directory's listing, a service found by the kubelet's file
// heuristics, its query errors, a symlink leading out refused; the view
// token is refused.
func TestKubectlNodeLogs(t *testing.T) {
	top := t.TempDir()
	logDir := filepath.Join(top, "log")
	appLog := "start\nwarn: disk low\nready\nwarn: slow\nstop\n"
	for name, body := range map[string]string{"app.log": appLog, "noderun.log": "noderun was here\n", filepath.Join(top, "secret"): "secret\n"} {
		if !filepath.IsAbs(name) {
			name = filepath.Join(logDir, name)
		}
		if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(name, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("../secret", filepath.Join(logDir, "escape.log")); err != nil {
		t.Fatal(err)
	}
	n := newNode(t, "--node-log-dir", logDir)
	admin, view := n.kubeconfig(true), n.kubeconfig(false)
	logs := "/api/v1/nodes/" + nodeName + "/proxy/logs/"

	if out := n.kubectlOK(admin, "get", "--raw", logs+"?query=/app.log"); out != appLog {
		t.Errorf("query=/app.log: %q, want %q", out, appLog)
	}
	if out := n.kubectlOK(admin, "get", "--raw", logs+"app.log"); out != appLog {
		t.Errorf("logs/app.log: %q, want %q", out, appLog)
	}
	if out := n.kubectlOK(admin, "get", "--raw", logs); !strings.Contains(out, `href="app.log"`) {
		t.Errorf("the listing: %q", out)
	}
	// noderun's own log, where the kubelet looks for a service's file.
	if out := n.kubectlOK(admin, "get", "--raw", logs+"?query=noderun"); out != "noderun was here\n" {
		t.Errorf("query=noderun: %q", out)
	}
	// tailLines and pattern are journal options: the kubelet refuses them
	// with a file, and says so for a service that resolved to one.
	if out := n.kubectlOK(admin, "get", "--raw", logs+"?query=noderun&tailLines=2&pattern=warn"); !strings.Contains(out, "options present and query resolved to log files for [noderun]") {
		t.Errorf("query=noderun with options: %q", out)
	}
	for query, want := range map[string]string{
		"?query=/app.log&tailLines=2":     "cannot specify file with options",
		"?query=/app.log&pattern=warn":    "cannot specify file with options",
		"?query=noderun&tailLines=100001": "must be between 0 and 100000, inclusive",
		"?query=noderun&pattern=(":        "error parsing regexp",
		"?query=noderun&sinceTime=monday": "(BadRequest)", // kubectl shows a 400's text body only with -v
		"?query=noderun&boot=1":           "must be less than 1",
		"?query=/escape.log":              "path escapes from parent",
		"?query=/../secret":               "no such file or directory",
		"escape.log":                      "(Forbidden)",
		"app.log?query=noderun":           "path not allowed in query mode",
	} {
		if out, stderr, err := n.kubectl(admin, "get", "--raw", logs+query); err == nil || !strings.Contains(stderr, want) || strings.Contains(out+stderr, "secret\n") {
			t.Errorf("%s: %v %q %q, want an error with %q", query, err, out, stderr, want)
		}
	}
	if _, stderr, err := n.kubectl(view, "get", "--raw", logs+"?query=/app.log"); err == nil || !strings.Contains(stderr, "Forbidden") {
		t.Errorf("the view token: %v %q, want Forbidden", err, stderr)
	}
	if _, stderr, err := n.kubectl(admin, "get", "--raw", "/api/v1/nodes/other/proxy/logs/"); err == nil || !strings.Contains(stderr, `nodes "other" not found`) {
		t.Errorf("another node: %v %q", err, stderr)
	}
}
