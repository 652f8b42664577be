package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/errdefs"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/cni"
	"github.com/noderun/noderun/internal/testenv"
)

// reboot does to a stopped node what a power cut does: every task is gone
// (the container records stay, in containerd's database) and the run dir,
// a tmpfs, is empty, so the pods' pinned namespaces and veths are gone.
// The state dir, with the CNI leases and cache, stays.
func (n *node) reboot() {
	t := n.t
	t.Helper()
	if n.running() {
		t.Fatal("reboot: noderun still runs")
	}
	ctx := n.ctx()
	cs, err := client.Containers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		if task, err := c.Task(ctx, nil); err == nil {
			if _, err := task.Delete(ctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
				t.Fatalf("reboot: delete task %s: %v", c.ID(), err)
			}
		}
	}
	sandboxes, _ := os.ReadDir(filepath.Join(n.run, "pods"))
	for _, sb := range sandboxes {
		if err := cni.RemoveNamespaces(filepath.Join(n.run, "pods", sb.Name()), nil); err != nil {
			t.Fatal(err)
		}
	}
	mounts := mountsUnder(t, n.run)
	slices.Reverse(mounts)
	for _, m := range mounts {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
			t.Fatalf("reboot: unmount %s: %v", m, err)
		}
	}
	if err := os.RemoveAll(n.run); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(n.run, 0o755); err != nil {
		t.Fatal(err)
	}
}

func terminated(cs v1.ContainerStatus) *v1.ContainerStateTerminated { return cs.State.Terminated }

// After a reboot, what had ended stays ended with its exit code, and what
// was cut off while running is a lost exit (255, Unknown, as CRI reports
// it): a finished OnFailure job does not run again, a Never pod that was
// cut off is Failed, not Succeeded, and an Always pod restarts. A pod that
// will run nothing again gets no new sandbox, as in the kubelet: its
// statuses are the ones from before, it has no IP and is not
// ReadyToStartContainers.
func TestRebootKeepsExits(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("job.yaml", `apiVersion: v1
kind: Pod
metadata:
  name: job
spec:
  restartPolicy: OnFailure
  initContainers:
  - name: setup
    image: busybox:1.36
    command: ["true"]
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", "echo done"]
`)
	n.writeManifest("failed.yaml", `apiVersion: v1
kind: Pod
metadata:
  name: failed
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", "exit 3"]
`)
	n.writeManifest("done.yaml", `apiVersion: v1
kind: Pod
metadata:
  name: done
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: busybox:1.36
    command: ["true"]
`)
	n.writeManifest("cutoff.yaml", strings.Replace(sleeperPod("cutoff", "busybox:1.36", "working"),
		"spec:\n", "spec:\n  restartPolicy: Never\n", 1))
	n.writeManifest("steady.yaml", sleeperPod("steady", "busybox:1.36", "up"))
	phase := func(want v1.PodPhase) func(*v1.Pod) bool {
		return func(p *v1.Pod) bool { return p.Status.Phase == want }
	}
	job := n.waitPod("job", "Succeeded", phase(v1.PodSucceeded))
	ended := map[string]*v1.Pod{
		"job":    job,
		"failed": n.waitPod("failed", "Failed", phase(v1.PodFailed)),
		"done":   n.waitPod("done", "Succeeded", phase(v1.PodSucceeded)),
	}
	n.waitPod("cutoff", "Running", running)
	n.waitPod("steady", "Running", running)
	jobContainers := len(n.containers(string(job.UID)))

	n.kill9()
	n.reboot()
	n.start()

	steady := n.waitPod("steady", "restarted after the reboot", func(p *v1.Pod) bool {
		return running(p) && p.Status.ContainerStatuses[0].RestartCount == 1
	})
	if last := steady.Status.ContainerStatuses[0].LastTerminationState.Terminated; last == nil || last.ExitCode != 255 || last.Reason != "Unknown" {
		t.Errorf("steady: lastState %+v, want the lost run's exit 255, reason Unknown", last)
	}
	cutoff := n.waitPod("cutoff", "Failed", phase(v1.PodFailed))
	if term := terminated(cutoff.Status.ContainerStatuses[0]); term == nil || term.ExitCode != 255 || term.Reason != "Unknown" {
		t.Errorf("cutoff: %s; want terminated 255 Unknown", statusJSON(cutoff))
	}
	for name, before := range ended {
		after := n.waitPod(name, "published after the reboot", func(p *v1.Pod) bool {
			return condition(p, v1.PodReadyToStartContainers) != nil
		})
		n.keptEnded(name, before, after)
	}
	time.Sleep(2 * time.Second) // time to (wrongly) run anything again
	job = n.pod("job")
	if job.Status.Phase != v1.PodSucceeded || job.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("job after the reboot: %s; want Succeeded, never run again", statusJSON(job))
	}
	if got := len(n.containers(string(job.UID))); got != jobContainers {
		t.Errorf("job has %d containers after the reboot, %d before: it ran again", got, jobContainers)
	}
	failed := n.pod("failed")
	if term := terminated(failed.Status.ContainerStatuses[0]); failed.Status.Phase != v1.PodFailed || term == nil || term.ExitCode != 3 {
		t.Errorf("failed after the reboot: %s; want Failed with exit code 3", statusJSON(failed))
	}
	if cutoff := n.pod("cutoff"); cutoff.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("cutoff ran again under restartPolicy Never: %s", statusJSON(cutoff))
	}
}

// keptEnded checks that a pod that had ended got no new sandbox after the
// reboot: the same phase and container statuses, no IP, its old one
// released (the kubelet stops the old sandbox).
func (n *node) keptEnded(name string, before, after *v1.Pod) {
	t := n.t
	t.Helper()
	if slices.Contains(n.leases(), before.Status.PodIP) {
		t.Errorf("%s after the reboot: its old IP %s is still leased", name, before.Status.PodIP)
	}
	if c := condition(after, v1.PodReadyToStartContainers); c.Status != v1.ConditionFalse {
		t.Errorf("%s after the reboot: PodReadyToStartContainers %s, want False (no new sandbox)", name, c.Status)
	}
	if after.Status.PodIP != "" || len(after.Status.PodIPs) != 0 {
		t.Errorf("%s after the reboot: pod IP %q (before: %q), want none (no new sandbox)", name, after.Status.PodIP, before.Status.PodIP)
	}
	if after.Status.Phase != before.Status.Phase {
		t.Errorf("%s after the reboot: phase %s, want %s", name, after.Status.Phase, before.Status.Phase)
	}
	all := func(p *v1.Pod) []v1.ContainerStatus {
		return append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...)
	}
	b, a := all(before), all(after)
	for i := range b {
		bt, at := terminated(b[i]), terminated(a[i])
		if a[i].ContainerID != b[i].ContainerID || a[i].RestartCount != b[i].RestartCount || bt == nil || at == nil ||
			at.ExitCode != bt.ExitCode || !at.StartedAt.Equal(&bt.StartedAt) || !at.FinishedAt.Equal(&bt.FinishedAt) {
			t.Errorf("%s after the reboot: %s; want the statuses from before: %s", name, statusJSON(after), statusJSON(before))
			return
		}
	}
}

// A container whose shim stalls (stopped here; swapping or starved on a
// small board in life) is in a state containerd cannot tell: noderun,
// restarted meanwhile, reports that and leaves the container alone, and
// the same process runs on once the shim answers again.
func TestStalledShimKeepsItsContainer(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("steady.yaml", sleeperPod("steady", "busybox:1.36", "up"))
	before := n.waitPod("steady", "Running", running)
	id := containerID(before.Status.ContainerStatuses[0])
	pid := n.task(id).Pid
	shim := testenv.ParentPID(t, int(pid))
	testenv.Stop(t, shim)
	n.kill9()
	n.start()
	n.waitPod("steady", "its state reported unknown", func(p *v1.Pod) bool {
		w := p.Status.ContainerStatuses[0].State.Waiting
		return w != nil && w.Reason == "ContainerStatusUnknown"
	})
	time.Sleep(3 * time.Second) // a few more looks while it is stalled
	syscall.Kill(shim, syscall.SIGCONT)
	after := n.waitPod("steady", "Running again", running)
	cs := after.Status.ContainerStatuses[0]
	if containerID(cs) != id || cs.RestartCount != 0 {
		t.Fatalf("container %s restart %d, want %s untouched", containerID(cs), cs.RestartCount, id)
	}
	if got := n.task(id).Pid; got != pid {
		t.Fatalf("task pid %d, want %d: the process was replaced", got, pid)
	}
}
