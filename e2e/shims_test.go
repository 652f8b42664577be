package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
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
