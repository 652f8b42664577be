package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/internal/testenv"
)

// plantStrayShim leaves what a noderun killed during a task's deletion
// can: a runc v2 shim of the node's namespace and containerd serving no
// task, its bundle deleted. It returns the shim's pid; the test kills it at
// cleanup should noderun not.
func plantStrayShim(t *testing.T, ns, id string) int {
	t.Helper()
	bundle := t.TempDir()
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The shim logs to a FIFO its containerd reads.
	if err := unix.Mkfifo(filepath.Join(bundle, "log"), 0o600); err != nil {
		t.Fatal(err)
	}
	logReader, err := os.OpenFile(filepath.Join(bundle, "log"), os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { logReader.Close() })
	cmd := exec.Command("containerd-shim-runc-v2", "-namespace", ns, "-id", id, "-address", ctrdSocket, "start")
	cmd.Dir = bundle
	cmd.Env = append(os.Environ(), "TTRPC_ADDRESS="+ctrdSocket+".ttrpc")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("start shim: %v: %s", err, out)
	}
	socket := strings.TrimPrefix(strings.TrimSpace(string(out)), "unix://")
	t.Cleanup(func() { os.Remove(socket) })
	// The shim is the process of that command line holding the bundle's
	// log; once it has opened it the bundle may go.
	want := "containerd-shim-runc-v2\x00" + strings.Join(cmd.Args[1:len(cmd.Args)-1], "\x00") + "\x00"
	for deadline := time.Now().Add(waitTimeout); time.Now().Before(deadline); time.Sleep(pollEvery / 4) {
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			target, _ := os.Readlink(filepath.Join("/proc", e.Name(), "fd", "2"))
			if !strings.HasSuffix(string(cmdline), want) || target != filepath.Join(bundle, "log") {
				continue
			}
			pid, _ := strconv.Atoi(e.Name())
			t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
			if err := os.RemoveAll(bundle); err != nil {
				t.Fatal(err)
			}
			return pid
		}
	}
	t.Fatalf("no shim process for %s after %s", id, waitTimeout)
	return 0
}

// A noderun starting kills a shim of its namespace and containerd that
// serves no task, and leaves its pods' running.
func TestStartKillsStrayShim(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("p.yaml", sleeperPod("keep", "busybox:1.36", "keep"))
	before := n.waitPod("keep", "Running", running)
	id := containerID(before.Status.ContainerStatuses[0])
	taskPID := n.task(id).Pid
	n.stop()
	stray := plantStrayShim(t, n.ns, "stray")
	n.start()
	for deadline := time.Now().Add(waitTimeout); alive(stray); time.Sleep(pollEvery / 4) {
		if time.Now().After(deadline) {
			t.Fatalf("stray shim %d still runs %s after noderun started", stray, waitTimeout)
		}
	}
	p := n.waitPod("keep", "still Running", running)
	if got := containerID(p.Status.ContainerStatuses[0]); got != id || n.task(id).Pid != taskPID {
		t.Fatalf("the pod's container %s (task pid %d), want %s (%d) untouched", got, n.task(id).Pid, id, taskPID)
	}
}

// A pod's containers share one shim. One of them restarting (its run
// replaced), noderun killed and started again meanwhile, and the shim's
// first container being the one replaced, leave its sibling's process
// untouched in the same shim; the shim ends with the pod.
func TestGroupedPodRestartsOneContainer(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("pair.yaml", `apiVersion: v1
kind: Pod
metadata:
  name: pair
spec:
  terminationGracePeriodSeconds: 5
  containers:
  - name: crasher
    image: busybox:1.36
    command: ["sh", "-c", "sleep 2; exit 3"]
  - name: steady
    image: busybox:1.36
    command: ["sh", "-c", '`+untilTerm+`']
`)
	byName := func(p *v1.Pod, name string) v1.ContainerStatus {
		for _, cs := range p.Status.ContainerStatuses {
			if cs.Name == name {
				return cs
			}
		}
		t.Fatalf("no status of %s", name)
		return v1.ContainerStatus{}
	}
	first := n.waitPod("pair", "both running", func(p *v1.Pod) bool {
		return len(p.Status.ContainerStatuses) == 2 && byName(p, "crasher").State.Running != nil && byName(p, "steady").State.Running != nil
	})
	crasherTask := n.task(containerID(byName(first, "crasher")))
	steadyID := containerID(byName(first, "steady"))
	steadyPID := n.task(steadyID).Pid
	shim := testenv.ParentPID(t, int(steadyPID))
	if got := testenv.ParentPID(t, int(crasherTask.Pid)); got != shim {
		t.Fatalf("the pod's containers run under shims %d and %d, want one", got, shim)
	}
	// Containers start in order: the shim was started for crasher's first
	// run, which its restart removes.
	if cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", shim)); !strings.Contains(string(cmdline), "\x00"+crasherTask.ID+"\x00") {
		t.Fatalf("the pod's shim was started for another container than crasher's first run %s: %q", crasherTask.ID, cmdline)
	}

	restarted := func(after int32) func(*v1.Pod) bool {
		return func(p *v1.Pod) bool {
			cs := byName(p, "crasher")
			return cs.RestartCount > after && cs.State.Running != nil
		}
	}
	p := n.waitPodFor("pair", "crasher restarted", 2*waitTimeout, restarted(0))
	n.kill9()
	n.start()
	p = n.waitPodFor("pair", "crasher restarted after noderun's restart", 2*waitTimeout, restarted(byName(p, "crasher").RestartCount))
	cs := byName(p, "crasher")
	if got := testenv.ParentPID(t, int(n.task(containerID(cs)).Pid)); got != shim {
		t.Errorf("crasher's run %d under shim %d, want the pod's %d", cs.RestartCount, got, shim)
	}
	steady := byName(p, "steady")
	if containerID(steady) != steadyID || steady.RestartCount != 0 || n.task(steadyID).Pid != steadyPID {
		t.Fatalf("steady is %s (restarts %d), want %s untouched", containerID(steady), steady.RestartCount, steadyID)
	}
	n.removeManifest("pair.yaml")
	n.waitGone("pair", waitTimeout)
	for deadline := time.Now().Add(waitTimeout); alive(shim); time.Sleep(pollEvery / 4) {
		if time.Now().After(deadline) {
			t.Fatalf("the pod's shim %d still runs %s after the pod was removed", shim, waitTimeout)
		}
	}
}
