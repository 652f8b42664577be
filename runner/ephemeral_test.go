package runner

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
)

func ephemeralStatus(p *v1.Pod, name string) *v1.ContainerStatus {
	if p == nil {
		return nil
	}
	for i := range p.Status.EphemeralContainerStatuses {
		if p.Status.EphemeralContainerStatuses[i].Name == name {
			return &p.Status.EphemeralContainerStatuses[i]
		}
	}
	return nil
}

// An ephemeral container starts once, in its target's PID namespace, is
// reported, is kept in the pod's state dir, and never restarts, whatever
// its exit; a bad one is refused, an unknown pod not found.
func TestEngineEphemeralContainers(t *testing.T) {
	f := startEngine(t)
	f.send(testPod("u1", "web", v1.RestartPolicyAlways))
	waitFor(t, "main started", func() bool { return f.rt.startedCount() == 1 })
	waitFor(t, "main running", func() bool { p := f.status("u1"); return p != nil && p.Status.Phase == v1.PodRunning })
	dbg := v1.EphemeralContainer{TargetContainerName: "main",
		EphemeralContainerCommon: v1.EphemeralContainerCommon{Name: "dbg", Image: "busybox:1.36", Stdin: true, TTY: true}}
	pod, _, err := f.e.SetEphemeralContainers("default", "web-n1", []v1.EphemeralContainer{dbg})
	if err != nil {
		t.Fatal(err)
	}
	if len(pod.Spec.EphemeralContainers) != 1 || pod.Spec.EphemeralContainers[0].ImagePullPolicy != v1.PullIfNotPresent {
		t.Errorf("returned %+v, want dbg defaulted", pod.Spec.EphemeralContainers)
	}
	waitFor(t, "dbg started", func() bool { return f.rt.startedCount() == 2 })
	main, started := f.rt.started[0], f.rt.started[1]
	if started.Container.Name != "dbg" || started.TargetPID != f.rt.containers[main.ID].PID || started.TargetPID == 0 {
		t.Errorf("started %s with target PID %d, want dbg in main's (%d)", started.Container.Name, started.TargetPID, f.rt.containers[main.ID].PID)
	}
	waitFor(t, "dbg running in the status", func() bool {
		st := ephemeralStatus(f.status("u1"), "dbg")
		return st != nil && st.State.Running != nil
	})
	// Its events name it in the list it is declared in, as the kubelet's.
	if !slices.ContainsFunc(f.e.Events(), func(ev v1.Event) bool {
		return ev.Reason == "Started" && ev.InvolvedObject.FieldPath == "spec.ephemeralContainers{dbg}"
	}) {
		t.Errorf("no Started event for spec.ephemeralContainers{dbg}: %+v", f.e.Events())
	}
	b, err := os.ReadFile(filepath.Join(f.e.cfg.StateDir, "pods", "u1", ephemeralFile))
	var kept []v1.EphemeralContainer
	if err == nil {
		err = json.Unmarshal(b, &kept)
	}
	if err != nil || len(kept) != 1 || kept[0].Name != "dbg" {
		t.Errorf("kept %s (%v), want dbg", b, err)
	}

	// Its exit is final: the sync that reports it started nothing.
	f.rt.exit(started.ID, 3)
	waitFor(t, "dbg terminated", func() bool {
		st := ephemeralStatus(f.status("u1"), "dbg")
		return st != nil && st.State.Terminated != nil && st.State.Terminated.ExitCode == 3
	})
	if n := f.rt.startedCount(); n != 2 {
		t.Errorf("%d starts after dbg's exit, want none", n-2)
	}
	if p := f.status("u1"); p.Status.Phase != v1.PodRunning || len(p.Spec.EphemeralContainers) != 1 {
		t.Errorf("pod %s with %d ephemeral containers, want Running with dbg", p.Status.Phase, len(p.Spec.EphemeralContainers))
	}

	bad := dbg
	bad.Name, bad.Ports = "bad", []v1.ContainerPort{{ContainerPort: 80}}
	var inv *InvalidError
	if _, _, err := f.e.SetEphemeralContainers("default", "web-n1", []v1.EphemeralContainer{pod.Spec.EphemeralContainers[0], bad}); !errors.As(err, &inv) {
		t.Errorf("ports: %v, want InvalidError", err)
	}
	if _, _, err := f.e.SetEphemeralContainers("default", "nope", nil); !errors.Is(err, ErrPodNotFound) {
		t.Errorf("unknown pod: %v, want ErrPodNotFound", err)
	}
}
