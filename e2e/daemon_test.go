package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	tasktypes "github.com/containerd/containerd/api/types/task"
	v1 "k8s.io/api/core/v1"

	ctrddaemon "github.com/noderun/noderun/runner/containerd/daemon"
)

// A second noderun on the same state and run dirs exits at once, naming
// the running one, and touches nothing: the status socket stays the first
// one's and the first one's pod (which the second, with no manifests,
// would remove as an orphan) keeps running.
func TestSecondInstanceRefused(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("p.yaml", sleeperPod("solo", "busybox:1.36", "solo"))
	before := n.waitPod("solo", "Running", running)
	sock, err := os.Stat(n.socket)
	if err != nil {
		t.Fatal(err)
	}
	empty := t.TempDir()
	// Bounded: a noderun that does not refuse keeps running.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, noderunBin, "--manifests", empty, "--node-name", nodeName,
		"--state-dir", n.state, "--run-dir", n.run, "--pod-log-dir", n.logs, "--images-dir", n.images,
		"--containerd-address", ctrdSocket, "--containerd-namespace", n.ns,
		"--cni-conf-dir", n.cniConf, "--cni-bin-dir", cniBinDir, "--status-socket", n.socket)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() == 0 {
		t.Fatalf("second noderun: %v, want a non-zero exit\n%s", err, out)
	}
	if want := "pid " + strconv.Itoa(n.proc.Process.Pid); !strings.Contains(string(out), want) {
		t.Errorf("second noderun's message does not name the holder (%q):\n%s", want, out)
	}
	after, err := os.Stat(n.socket)
	if err != nil || !os.SameFile(sock, after) {
		t.Errorf("status socket replaced by the second noderun (%v)", err)
	}
	p := n.waitPod("solo", "still Running", running)
	if containerID(p.Status.ContainerStatuses[0]) != containerID(before.Status.ContainerStatuses[0]) {
		t.Fatalf("container %s, want %s untouched", p.Status.ContainerStatuses[0].ContainerID,
			before.Status.ContainerStatuses[0].ContainerID)
	}
	if task := n.task(containerID(p.Status.ContainerStatuses[0])); task.Status != tasktypes.Status_RUNNING {
		t.Fatalf("the pod's task is %v, want running", task.Status)
	}
}

// `noderun images import` never starts a containerd: with nothing at
// --containerd-address it fails (it used to start a managed one).
func TestImagesImportNeverStartsContainerd(t *testing.T) {
	t.Parallel()
	requireE2E(t)
	dir, err := os.MkdirTemp("/tmp", "nre") // sun_path is short
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	run := filepath.Join(dir, "r")
	t.Cleanup(func() { stopManaged(t, run) })
	out, err := exec.Command(noderunBin, "--containerd-address", filepath.Join(dir, "none", "c.sock"),
		"--state-dir", filepath.Join(dir, "s"), "--run-dir", run, "images", "import", imageTar).CombinedOutput()
	if err == nil {
		t.Errorf("images import succeeded with no containerd:\n%s", out)
	}
	if pid := managedPIDIn(run); pid > 0 {
		t.Fatalf("images import started a containerd (pid %d)", pid)
	}
}

// When the managed containerd dies, noderun starts it again, and the pods
// in it stay supervised: a container that exits afterwards is restarted.
func TestManagedContainerdRestartedAfterKill(t *testing.T) {
	t.Parallel()
	n, pid := newManagedNode(t)
	host := t.TempDir()
	n.writeManifest("p.yaml", fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: supervised
spec:
  terminationGracePeriodSeconds: 5
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", 'trap "exit 0" TERM; while [ ! -e /h/stop ]; do sleep 0.2; done; rm /h/stop; exit 1']
    volumeMounts:
    - {name: h, mountPath: /h}
  volumes:
  - name: h
    hostPath: {path: %s, type: Directory}
`, host))
	n.waitPod("supervised", "Running", running)

	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(waitTimeout)
	for again := managedPID(n); again <= 0 || again == pid; again = managedPID(n) {
		if time.Now().After(deadline) {
			t.Fatalf("managed containerd not restarted %s after kill -9", waitTimeout)
		}
		time.Sleep(pollEvery)
	}
	if err := os.WriteFile(filepath.Join(host, "stop"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	n.waitPodFor("supervised", "restarted after its exit", 2*time.Minute, func(p *v1.Pod) bool {
		return running(p) && p.Status.ContainerStatuses[0].RestartCount >= 1
	})
}

// pgrep is the pid of the first process whose command line contains s, or 0.
func pgrep(s string) int {
	out, err := exec.Command("pgrep", "-f", s).Output()
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.Fields(string(out))[0])
	return pid
}

// managedPIDIn is the pid of the managed containerd of a run dir, or 0. Its
// config file is there; the shims' command lines name the directory too.
func managedPIDIn(runDir string) int {
	return pgrep("containerd --config " + filepath.Join(runDir, "containerd") + "/")
}

// stopManaged stops the managed containerd of a run dir. It is held by a
// pidfd (os.FindProcess) from the moment it is found, so that the SIGKILL
// after it has gone reaches nothing, not a later process given its pid.
func stopManaged(t *testing.T, runDir string) {
	pid := managedPIDIn(runDir)
	if pid <= 0 {
		return
	}
	p, err := os.FindProcess(pid)
	if err != nil {
		return
	}
	_ = p.Signal(syscall.SIGTERM)
	for i := 0; i < 100 && p.Signal(syscall.Signal(0)) == nil; i++ {
		time.Sleep(50 * time.Millisecond)
	}
	_ = p.Kill()
}

// Under systemd (NOTIFY_SOCKET, WATCHDOG_USEC) noderun extends its start
// timeout until it is ready, then says READY=1 and feeds the watchdog.
// Not parallel: it sets the environment noderun inherits.
func TestSystemdNotifications(t *testing.T) {
	requireE2E(t)
	dir, err := os.MkdirTemp("/tmp", "nre") // sun_path is short
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	t.Setenv("NOTIFY_SOCKET", sock)
	t.Setenv("WATCHDOG_USEC", "400000")
	n := newNode(t)
	var got []string
	buf := make([]byte, 4096)
	readUntil := func(want string) {
		t.Helper()
		for !slices.Contains(got, want) {
			if err := conn.SetReadDeadline(time.Now().Add(waitTimeout)); err != nil {
				t.Fatal(err)
			}
			k, _, err := conn.ReadFromUnix(buf)
			if err != nil {
				t.Fatalf("waiting for %q after %q: %v", want, got, err)
			}
			got = append(got, string(buf[:k]))
		}
	}
	readUntil("WATCHDOG=1")
	ready := slices.Index(got, "READY=1")
	if ready < 0 || !strings.HasPrefix(got[0], "EXTEND_TIMEOUT_USEC=") || slices.Index(got, "WATCHDOG=1") < ready {
		t.Fatalf("notifications %q, want EXTEND_TIMEOUT_USEC first, then READY=1, then WATCHDOG=1", got)
	}
	// The status line shows the pod counts, sent only when they change.
	readUntil("STATUS=0 pods")
	n.writeManifest("p.yaml", sleeperPod("counted", "busybox:1.36", "counted"))
	readUntil("STATUS=1 pod: 1 running")
	var statuses []string
	for _, s := range got {
		if strings.HasPrefix(s, "STATUS=") {
			statuses = append(statuses, s)
		}
	}
	if len(slices.Compact(slices.Clone(statuses))) != len(statuses) {
		t.Errorf("status lines %q: one repeated without a change", statuses)
	}
}

// A containerd noderun has used is waited for while it is away (here: its
// socket and socket directory are gone, as before a first start): noderun
// starts no managed one, /healthz says what it waits for, and once the
// daemon is back noderun adopts the pod that kept running.
func TestWaitsForRecordedContainerd(t *testing.T) {
	t.Parallel()
	requireE2E(t)
	dir, err := os.MkdirTemp("/tmp", "nre") // sun_path is short
	if err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(dir, "d", "c.sock")
	start := func() (*ctrddaemon.Process, error) {
		return ctrddaemon.Start(context.Background(), filepath.Join(dir, "root"), filepath.Join(dir, "state"),
			socket, filepath.Join(dir, "containerd.log"))
	}
	daemon, err := start()
	if err != nil {
		t.Fatal(err)
	}
	var n *node
	// Registered first so it runs last, after the node has torn pods down.
	t.Cleanup(func() {
		if daemon != nil {
			_ = daemon.Stop(context.Background())
		}
		if n != nil {
			stopManaged(t, n.run) // should there be one
		}
		os.RemoveAll(dir)
	})
	n = newNode(t, "--containerd-address", socket)
	n.writeManifest("p.yaml", sleeperPod("kept", "busybox:1.36", "kept"))
	before := n.waitPod("kept", "Running", running)
	n.stop()
	if err := daemon.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	daemon = nil
	if err := os.RemoveAll(filepath.Join(dir, "d")); err != nil {
		t.Fatal(err)
	}

	var health string
	var managed int
	back := make(chan error, 1)
	go func() {
		time.Sleep(3 * time.Second)
		health = fmt.Sprint(n.get("/healthz", new(string)))
		managed = managedPIDIn(n.run)
		var err error
		daemon, err = start()
		back <- err
	}()
	n.start() // returns once healthy
	if err := <-back; err != nil {
		t.Fatal(err)
	}
	if managed != 0 {
		t.Fatalf("noderun started a managed containerd (pid %d) while its own was away", managed)
	}
	if !strings.Contains(health, "503") || !strings.Contains(health, "waiting for containerd") {
		t.Errorf("/healthz while containerd was away: %s, want 503 waiting for containerd", health)
	}
	after := n.waitPod("kept", "Running, adopted", running)
	if containerID(after.Status.ContainerStatuses[0]) != containerID(before.Status.ContainerStatuses[0]) ||
		after.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Fatalf("container %s (restarts %d), want %s adopted untouched", after.Status.ContainerStatuses[0].ContainerID,
			after.Status.ContainerStatuses[0].RestartCount, before.Status.ContainerStatuses[0].ContainerID)
	}
}

// make run on a host whose PID 1 is not systemd (a container, WSL, a CI
// runner; this machine): Debian's containerd package installed
// containerd.service, which nothing starts, and a containerd's shims made
// its socket's directory. noderun used to wait for that system containerd
// for ever (issue 35); it runs a managed one, records and logs the choice,
// and the examples make run runs come up.
func TestFirstStartWithoutSystemd(t *testing.T) {
	t.Parallel()
	requireE2E(t)
	if _, err := os.Stat("/run/systemd/system"); err == nil {
		t.Skip("systemd is PID 1 here; this test is of hosts without it")
	}
	dir, err := os.MkdirTemp("/tmp", "nre") // sun_path is short
	if err != nil {
		t.Fatal(err)
	}
	socketDir := filepath.Join(dir, "containerd")
	if err := os.MkdirAll(filepath.Join(socketDir, "s"), 0o700); err != nil {
		t.Fatal(err)
	}
	var n *node
	// Registered first so it runs last, after the node has torn pods down.
	t.Cleanup(func() {
		if n != nil {
			stopManaged(t, n.run)
		}
		os.RemoveAll(dir)
	})
	n = newNode(t, "--containerd-address", filepath.Join(socketDir, "containerd.sock"))
	b, err := os.ReadFile(filepath.Join(n.state, "containerd.json"))
	if err != nil || !strings.Contains(string(b), `"managed":true`) {
		t.Fatalf("containerd.json: %s (%v), want a managed containerd recorded", b, err)
	}
	if managedPID(n) <= 0 {
		t.Fatal("no managed containerd runs for the node")
	}
	out, err := os.ReadFile(n.out)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "chose the containerd to use") || !strings.Contains(string(out), "nothing will start a containerd there") {
		t.Errorf("the log does not say which containerd noderun chose and why:\n%s", out)
	}
	n.writeExamples()
	for _, name := range []string{"hello", "uptime"} {
		n.waitPod(name, "running", running)
	}
}
