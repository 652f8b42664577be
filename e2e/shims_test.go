package e2e

import (
	"os"
	"testing"
	"time"

	"github.com/noderun/noderun/internal/testenv"
)

// plantStrayShim leaves what a noderun killed during a task's deletion
// can: a runc v2 shim of the node's namespace and containerd serving no
// task, its bundle deleted. It returns the shim's pid; the test kills it at
// cleanup should noderun not.
func plantStrayShim(t *testing.T, ns, id string) int {
	t.Helper()
	bundle := t.TempDir()
	pid, _ := testenv.PlantShim(t, bundle, ctrdSocket, ns, id)
	if err := os.RemoveAll(bundle); err != nil {
		t.Fatal(err)
	}
	return pid
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
