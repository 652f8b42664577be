package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

// cgroupOf is the cgroup (v2) or the first hierarchy's (v1) of process pid.
func cgroupOf(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	parts := strings.SplitN(line, ":", 3)
	return parts[len(parts)-1]
}

// With --shim-groups 1 the node's pods share one shim, also a pod of two
// containers whose other one restarts meanwhile. The shim is in no pod's cgroup;
// removing a pod leaves the others running in it; a noderun killed and
// started again adopts them; the shim ends with the last pod.
func TestPodsShareOneShim(t *testing.T) {
	t.Parallel()
	n := newNode(t, "--shim-groups", "1")
	for _, name := range []string{"one", "two", "three"} {
		n.writeManifest(name+".yaml", sleeperPod(name, "busybox:1.36", name))
	}
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
	pids := map[string]uint32{} // by container ID
	for _, name := range []string{"one", "two", "three"} {
		p := n.waitPod(name, "Running", running)
		id := containerID(p.Status.ContainerStatuses[0])
		pids[id] = n.task(id).Pid
	}
	p := n.waitPodFor("pair", "crasher restarted", 2*waitTimeout, func(p *v1.Pod) bool {
		return len(p.Status.ContainerStatuses) == 2 && p.Status.ContainerStatuses[0].RestartCount > 0 &&
			running(p)
	})
	// crasher's run lives 2 s: steady's stands for the pod.
	steady := containerID(p.Status.ContainerStatuses[1])
	pids[steady] = n.task(steady).Pid
	shim := 0
	for id, pid := range pids {
		got := testenv.ParentPID(t, int(pid))
		if shim == 0 {
			shim = got
		}
		if got != shim {
			t.Fatalf("container %s runs under shim %d, want the node's one %d", id, got, shim)
		}
		if pod := filepath.Dir(cgroupOf(t, int(pid))); strings.HasPrefix(cgroupOf(t, shim)+"/", pod+"/") {
			t.Fatalf("the shared shim is in cgroup %s, inside the pod cgroup %s of container %s", cgroupOf(t, shim), pod, id)
		}
	}

	n.removeManifest("one.yaml")
	n.waitGone("one", waitTimeout)
	n.kill9()
	n.start()
	for _, name := range []string{"two", "three"} {
		p := n.waitPod(name, "Running after noderun's restart", running)
		id := containerID(p.Status.ContainerStatuses[0])
		if n.task(id).Pid != pids[id] {
			t.Fatalf("pod %s runs task %s pid %d, want its first run's %d, adopted", name, id, n.task(id).Pid, pids[id])
		}
	}
	if !alive(shim) {
		t.Fatal("the shared shim ended with one of its pods")
	}
	for _, name := range []string{"two", "three", "pair"} {
		n.removeManifest(name + ".yaml")
	}
	for _, name := range []string{"two", "three", "pair"} {
		n.waitGone(name, waitTimeout)
	}
	for deadline := time.Now().Add(waitTimeout); alive(shim); time.Sleep(pollEvery / 4) {
		if time.Now().After(deadline) {
			t.Fatalf("the shared shim %d still runs %s after its last pod was removed", shim, waitTimeout)
		}
	}
}
