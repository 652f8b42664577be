package e2e

import (
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// docsWebPod is the web-$(hostname) of docs/kubectl.md: it fails its first
// run (so `kubectl logs -p` has a previous run), then prints a line a
// second until told to stop.
const docsWebPod = `apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: web}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", 'if [ ! -e /d/ran ]; then touch /d/ran; echo first run; exit 1; fi; trap "exit 0" TERM; while :; do echo "web $(date +%s)"; sleep 1 & wait; done']
    volumeMounts: [{name: d, mountPath: /d}]
  volumes: [{name: d, emptyDir: {}}]
`

// docCommands returns the command lines of the sh blocks in a Markdown
// file, from the heading section on up to the next heading of its level
// (the whole file when section is empty), with comments cut.
func docCommands(t *testing.T, path, section string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	if section != "" {
		_, rest, ok := strings.Cut(text, "\n"+section+"\n")
		if !ok {
			t.Fatalf("%s has no %q", path, section)
		}
		level := section[:strings.Index(section, " ")+1]
		text, _, _ = strings.Cut(rest, "\n"+level)
	}
	var lines []string
	for {
		_, block, ok := strings.Cut(text, "```sh\n")
		if !ok {
			break
		}
		block, text, _ = strings.Cut(block, "```")
		for _, line := range strings.Split(block, "\n") {
			line, _, _ = strings.Cut(line, "#")
			if line = strings.TrimSpace(line); line != "" {
				lines = append(lines, line)
			}
		}
	}
	if len(lines) == 0 {
		t.Fatalf("%s %s: no commands", path, section)
	}
	return lines
}

// Every command of the README's quick start, of docs/kubectl.md and of
// operating.md's status API runs as the text says, on a node running the
// examples the quick start's `make run` runs, beside the doc's web pod.
func TestDocsCommands(t *testing.T) {
	t.Parallel()
	cmds := append(docCommands(t, "../README.md", "## Quick start"), docCommands(t, "../docs/kubectl.md", "")...)
	cmds = append(cmds, docCommands(t, "../docs/operating.md", "## Status API")...)
	n := newNode(t)
	n.writeExamples()
	n.writeManifest("web.yaml", docsWebPod)
	hello := n.waitPod("hello", "running", running)
	n.waitPod("web", "running after its first run failed", func(p *v1.Pod) bool {
		return running(p) && p.Status.ContainerStatuses[0].RestartCount > 0
	})

	d := &docRunner{n: n, podIP: hello.Status.PodIP}
	for _, line := range cmds {
		t.Run(line, func(t *testing.T) { d.run(t, line) })
	}
}

// writeExamples writes the manifests make run runs (examples/pods).
func (n *node) writeExamples() {
	n.t.Helper()
	examples, err := filepath.Glob("../examples/pods/*")
	if err != nil || len(examples) == 0 {
		n.t.Fatalf("examples: %v %v", examples, err)
	}
	for _, f := range examples {
		b, err := os.ReadFile(f)
		if err != nil {
			n.t.Fatal(err)
		}
		n.writeManifest(filepath.Base(f), string(b))
	}
}

type docRunner struct {
	n          *node
	kubeconfig string // what the docs' KUBECONFIG names, as the test's file
	podIP      string // the hello pod's
}

// path maps the docs' /root to a home of the test's own, which starts
// empty as root's does on a fresh machine, and the default run dir to the
// node's.
func (d *docRunner) path(p string) string {
	if rest, ok := strings.CutPrefix(p, "/root/"); ok {
		return filepath.Join(d.n.root, "home", rest)
	}
	if rest, ok := strings.CutPrefix(p, "/run/noderun/"); ok {
		return filepath.Join(d.n.run, rest)
	}
	return p
}

func (d *docRunner) run(t *testing.T, line string) {
	n := d.n
	line = strings.ReplaceAll(line, "$(hostname)", nodeName)
	args := strings.Fields(line)
	switch args[0] {
	case "make":
		// `make run` is what the node above does, with the harness's
		// containerd and image.
		if line != "make run" {
			t.Fatalf("no way to run %q", line)
		}
	case "mkdir":
		if len(args) != 3 || args[1] != "-p" {
			t.Fatalf("no way to run %q", line)
		}
		if err := os.MkdirAll(d.path(args[2]), 0o755); err != nil {
			t.Fatal(err)
		}
	case "export":
		path, ok := strings.CutPrefix(args[1], "KUBECONFIG=")
		if !ok {
			t.Fatalf("no way to run %q", line)
		}
		d.kubeconfig = d.path(path)
		if _, err := os.Stat(d.kubeconfig); err != nil {
			t.Fatalf("no kubeconfig written there before: %v", err)
		}
	case "curl":
		if args[1] == "--unix-socket" {
			// The status API, asked as curl would (curl is not among
			// the tests' packages).
			if sock := d.path(args[2]); sock != n.socket {
				t.Fatalf("the socket is %s, not %s", n.socket, sock)
			}
			resp, err := n.api.Get(args[3])
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK || len(b) == 0 {
				t.Errorf("%s: %s %q", args[3], resp.Status, b)
			}
			return
		}
		url := strings.Replace(strings.TrimPrefix(line, "curl "), "<pod IP>", d.podIP, 1)
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if want := "hello from hello-" + nodeName; !strings.Contains(string(b), want) {
			t.Errorf("%s: %s %q, want %q", url, resp.Status, b, want)
		}
	case "noderun", "bin/noderun":
		cargs := []string{"--state-dir", n.state, "--run-dir", n.run}
		for i := 1; i < len(args); i++ {
			a := args[i]
			if _, err := os.Stat(filepath.Join("..", a)); err == nil && !strings.HasPrefix(a, "/") {
				a = filepath.Join("..", a) // a path in the source tree
			}
			cargs = append(cargs, d.path(a))
		}
		out, err := n.runBounded(exec.Command(noderunBin, cargs...), waitTimeout)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if strings.TrimSpace(out) == "" && !slices.Contains(args, "-o") {
			t.Errorf("printed nothing")
		}
	case "kubectl":
		d.kubectl(t, args[1:])
	default:
		t.Fatalf("no way to run %q", line)
	}
}

// kubectl runs a kubectl line. The ones that stream until stopped (a
// watch, a follow, attach, port-forward) must print what they promise
// within a few seconds; the rest must succeed.
func (d *docRunner) kubectl(t *testing.T, args []string) {
	if d.kubeconfig == "" {
		t.Fatal("no KUBECONFIG exported before")
	}
	for i, a := range args {
		// A port-forward's local port: one the kernel picks, so that
		// parallel tests do not collide.
		if m := regexp.MustCompile(`^\d+:(\d+)$`).FindStringSubmatch(a); m != nil {
			args[i] = ":" + m[1]
		}
	}
	var want string
	switch {
	case slices.Contains(args, "-w"):
		want = "web-" + nodeName
	case args[0] == "logs" && slices.Contains(args, "-f"), args[0] == "attach":
		want = "web "
	case args[0] == "port-forward":
		want = "Forwarding from 127.0.0.1:"
	}
	if want != "" {
		// Stopped once it printed what it should; the bound is generous.
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		cmd := d.n.kubectlCmd(ctx, d.kubeconfig, args...)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		var out []byte
		buf := make([]byte, 4096)
		for !strings.Contains(string(out), want) {
			k, err := stdout.Read(buf)
			out = append(out, buf[:k]...)
			if err != nil {
				break
			}
		}
		cancel()
		err = cmd.Wait()
		if !strings.Contains(string(out), want) {
			t.Errorf("printed %q (%v), want %q", out, err, want)
		}
		return
	}
	out, errOut, err := d.n.kubectl(d.kubeconfig, args...)
	if err != nil {
		t.Fatalf("%v\n%s%s", err, out, errOut)
	}
	// A terminal is asked for with -t, and there is none here: kubectl says
	// so and runs the command with stdin, which is empty.
	if strings.TrimSpace(out) == "" && !slices.Contains(args, "-it") {
		t.Errorf("printed nothing")
	}
}
