package e2e

import (
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// A container's log is rotated by the log driver itself, as the kubelet's
// containerLogMaxSize/MaxFiles do: the newest rotated file plain, older
// ones gzipped, MaxFiles in all, the latest lines in the current file.
func TestLogRotation(t *testing.T) {
	t.Parallel()
	n := newNode(t, "--container-log-max-size", "8Ki", "--container-log-max-files", "3")
	n.writeManifest("chatty.yaml", `apiVersion: v1
kind: Pod
metadata:
  name: chatty
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", 'i=0; while [ $i -lt 2000 ]; do echo "line $i xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"; i=$((i+1)); done; echo done; sleep 3600']
`)
	p := n.waitPod("chatty", "Running", running)
	path := n.logPath(p, "main", 0)
	n.waitLogLine(path, "done")
	var files []string
	deadline := time.Now().Add(waitTimeout)
	for {
		files, _ = filepath.Glob(path + "*")
		if len(files) == 3 && slices.ContainsFunc(files, func(f string) bool { return strings.HasSuffix(f, ".gz") }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("log files %v; want 0.log, one plain rotated file and one gzipped", files)
		}
		time.Sleep(pollEvery)
	}
	lines := n.readLog(path)
	if len(lines) == 0 || lines[len(lines)-1].content != "done" || len(lines) > 200 {
		t.Fatalf("current log holds %d lines ending %v; want the last few, ending with done", len(lines), lines[len(lines)-1:])
	}
	if p := n.pod("chatty"); p.Status.ContainerStatuses[0].RestartCount != 0 || p.Status.Phase != v1.PodRunning {
		t.Fatalf("the chatty pod restarted or stopped: %s", statusJSON(p))
	}
}

// TestContainersLogThroughTheEmbeddedDriver: containerd's shim runs the
// log driver the binary embeds, installed in <state-dir>/bin, rather than
// noderun's binary, and the container's output reaches its log through it.
func TestContainersLogThroughTheEmbeddedDriver(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("hello.yaml", `apiVersion: v1
kind: Pod
metadata:
  name: hello
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", "echo hello through the driver; sleep 3600"]
`)
	p := n.waitPod("hello", "Running", running)
	n.waitLogLine(n.logPath(p, "main", 0), "hello through the driver")
	drivers, err := filepath.Glob(filepath.Join(n.state, "bin", "log-driver-*"))
	if err != nil || len(drivers) != 1 {
		t.Fatalf("installed drivers: %v, %v; want one", drivers, err)
	}
	cs := n.containers(string(p.UID))
	if len(cs) != 1 {
		t.Fatalf("%d containers", len(cs))
	}
	u, err := url.Parse(n.task(cs[0].ID).Stdout)
	if err != nil || u.Scheme != "binary" || u.Path != drivers[0] {
		t.Fatalf("the task's stdout is %v (%v); want the driver %s", u, err, drivers[0])
	}
	drv, err := os.Stat(drivers[0])
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Stat(noderunBin)
	if err != nil {
		t.Fatal(err)
	}
	if drv.Size()*4 > self.Size() {
		t.Errorf("the driver has %d bytes, noderun %d: not the small program", drv.Size(), self.Size())
	}
}
