package runner

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/manifests"
)

func sidecarPod(uid string, policy v1.RestartPolicy) *v1.Pod {
	pod := testPod(uid, "sc", policy)
	always := v1.ContainerRestartPolicyAlways
	pod.Spec.InitContainers = []v1.Container{{Name: "side", Image: "busybox:1.36", RestartPolicy: &always}}
	return pod
}

func (f *engineFixture) startedNames() []string {
	f.rt.mu.Lock()
	defer f.rt.mu.Unlock()
	var out []string
	for _, c := range f.rt.started {
		out = append(out, c.Container.Name)
	}
	return out
}

func (f *engineFixture) startedConfig(name string, restart int) *ContainerConfig {
	f.rt.mu.Lock()
	defer f.rt.mu.Unlock()
	for _, c := range f.rt.started {
		if c.Container.Name == name && c.RestartCount == restart {
			return c
		}
	}
	return nil
}

func (f *engineFixture) hasEvent(reason, substr string) bool {
	for _, ev := range f.e.events.list() {
		if ev.Reason == reason && strings.Contains(ev.Message, substr) {
			return true
		}
	}
	return false
}

func TestEngineSidecarStartsFirstAndStopsLast(t *testing.T) {
	f := startEngine(t)
	f.send(sidecarPod("u1", v1.RestartPolicyAlways))
	waitFor(t, "both started", func() bool { return f.rt.startedCount() == 2 })
	if got := f.startedNames(); !slices.Equal(got, []string{"side", "main"}) {
		t.Fatalf("start order %v, want the sidecar first", got)
	}
	waitFor(t, "Ready with the sidecar counted", func() bool {
		p := f.status("u1")
		return p != nil && p.Status.Phase == v1.PodRunning && len(p.Status.InitContainerStatuses) == 1 &&
			p.Status.InitContainerStatuses[0].Ready && conditionTrue(p, v1.PodReady) && conditionTrue(p, v1.PodInitialized)
	})
	side, main := f.startedConfig("side", 0).ID, f.startedConfig("main", 0).ID
	f.send()
	waitFor(t, "pod gone", func() bool { return f.status("u1") == nil })
	var stops []string
	for _, c := range f.rt.callLog() {
		if id, ok := strings.CutPrefix(c, "stop "); ok {
			stops = append(stops, strings.Fields(id)[0])
		}
	}
	if !slices.Equal(stops, []string{main, side}) {
		t.Fatalf("stop order %v, want the app container %s before the sidecar %s", stops, main, side)
	}
}

func TestEngineSidecarRestartsAndCompletedPodStopsIt(t *testing.T) {
	f := startEngine(t)
	f.send(sidecarPod("u1", v1.RestartPolicyNever))
	waitFor(t, "both started", func() bool { return f.rt.startedCount() == 2 })
	// A sidecar is restarted whatever the pod's policy.
	f.rt.exit(f.startedConfig("side", 0).ID, 1)
	waitFor(t, "sidecar restarted", func() bool { return f.startedConfig("side", 1) != nil })
	// The app container completes: the pod is done and the sidecar stops.
	f.rt.exit(f.startedConfig("main", 0).ID, 0)
	waitFor(t, "Succeeded", func() bool { p := f.status("u1"); return p != nil && p.Status.Phase == v1.PodSucceeded })
	waitFor(t, "sidecar stopped", func() bool {
		f.rt.mu.Lock()
		defer f.rt.mu.Unlock()
		return slices.Contains(f.rt.stopped, f.startedConfigLocked("side", 1).ID)
	})
	time.Sleep(20 * time.Millisecond)
	if f.startedConfig("side", 2) != nil {
		t.Fatal("the sidecar of a completed pod was started again")
	}
}

func (f *engineFixture) startedConfigLocked(name string, restart int) *ContainerConfig {
	for _, c := range f.rt.started {
		if c.Container.Name == name && c.RestartCount == restart {
			return c
		}
	}
	return &ContainerConfig{}
}

func TestEnginePreStopRunsBeforeTheStopWithinTheGrace(t *testing.T) {
	f := startEngine(t)
	pod := testPod("u1", "web", v1.RestartPolicyAlways)
	pod.Spec.Containers[0].Lifecycle = &v1.Lifecycle{PreStop: &v1.LifecycleHandler{Exec: &v1.ExecAction{Command: []string{"drain"}}}}
	f.send(pod)
	waitFor(t, "running", func() bool {
		p := f.status("u1")
		return p != nil && p.Status.ContainerStatuses[0].State.Running != nil
	})
	id := f.rt.started[0].ID
	f.send()
	waitFor(t, "pod gone", func() bool { return f.status("u1") == nil })
	calls := f.rt.callLog()
	if len(calls) != 2 || calls[0] != "exec "+id+" drain" || !strings.HasPrefix(calls[1], "stop "+id+" ") {
		t.Fatalf("calls %q; want the preStop exec, then the stop", calls)
	}
	// The fake clock stands still, so the whole 30 s grace is left.
	if !strings.HasSuffix(calls[1], " 30s") {
		t.Errorf("stop %q, want the remaining grace 30s", calls[1])
	}
	if !f.hasEvent("Killing", "Stopping container main") {
		t.Errorf("no Killing event: %+v", f.e.events.list())
	}
}

func TestEngineFailedPostStartKillsTheContainer(t *testing.T) {
	f := startEngine(t)
	f.rt.execResult = ExecResult{ExitCode: 1, Output: []byte("nope")}
	pod := testPod("u1", "web", v1.RestartPolicyAlways)
	pod.Spec.Containers[0].Lifecycle = &v1.Lifecycle{PostStart: &v1.LifecycleHandler{Exec: &v1.ExecAction{Command: []string{"setup"}}}}
	f.send(pod)
	waitFor(t, "FailedPostStartHook", func() bool { return f.hasEvent("FailedPostStartHook", "") })
	waitFor(t, "killed", func() bool {
		f.rt.mu.Lock()
		defer f.rt.mu.Unlock()
		return len(f.rt.started) > 0 && slices.Contains(f.rt.stopped, f.rt.started[0].ID)
	})
	waitFor(t, "not reported running", func() bool {
		p := f.status("u1")
		return p != nil && p.Status.ContainerStatuses[0].State.Running == nil
	})
}

func TestEngineStartErrorIsATerminatedRun(t *testing.T) {
	f := startEngine(t)
	f.rt.startErr = errors.New(`exec: "nosuch": executable file not found in $PATH`)
	f.send(testPod("u1", "job", v1.RestartPolicyNever))
	waitFor(t, "Failed with StartError", func() bool {
		p := f.status("u1")
		if p == nil || p.Status.Phase != v1.PodFailed {
			return false
		}
		term := p.Status.ContainerStatuses[0].State.Terminated
		return term != nil && term.Reason == "StartError" && term.ExitCode == 128 && strings.Contains(term.Message, "nosuch")
	})
}

func TestEngineActiveDeadlineFailsThePod(t *testing.T) {
	f := startEngine(t)
	pod := testPod("u1", "job", v1.RestartPolicyAlways)
	d := int64(60)
	pod.Spec.ActiveDeadlineSeconds = &d
	f.send(pod)
	waitFor(t, "Running", func() bool { p := f.status("u1"); return p != nil && p.Status.Phase == v1.PodRunning })
	f.clock.Advance(59 * time.Second)
	if p := f.status("u1"); p.Status.Phase != v1.PodRunning {
		t.Fatalf("phase %s before the deadline", p.Status.Phase)
	}
	f.clock.Advance(time.Second)
	waitFor(t, "DeadlineExceeded", func() bool {
		// A sync still going at the deadline arms its timer a moment
		// past it: time goes on.
		f.clock.Advance(time.Millisecond)
		p := f.status("u1")
		return p.Status.Phase == v1.PodFailed && p.Status.Reason == "DeadlineExceeded" && !conditionTrue(p, v1.PodReady)
	})
	f.rt.mu.Lock()
	defer f.rt.mu.Unlock()
	if !slices.Contains(f.rt.stopped, f.rt.started[0].ID) || len(f.rt.started) != 1 {
		t.Fatalf("stopped %v, started %d; want the container stopped and not restarted", f.rt.stopped, len(f.rt.started))
	}
}

// A deadline that passes while the sandbox is still being set up fails the
// pod with nothing to kill: the event comes all the same, once, as the
// kubelet's active deadline handler records it whenever it fails a pod.
func TestEngineActiveDeadlineBeforeAnyStart(t *testing.T) {
	f := startEngine(t)
	gate := make(chan struct{})
	f.net.mu.Lock()
	f.net.setupGate = gate
	f.net.mu.Unlock()
	pod := testPod("u1", "job", v1.RestartPolicyAlways)
	d := int64(3)
	pod.Spec.ActiveDeadlineSeconds = &d
	f.send(pod)
	waitFor(t, "the container precreated during Setup", func() bool { f.rt.mu.Lock(); defer f.rt.mu.Unlock(); return len(f.rt.created) == 1 })
	f.clock.Advance(3 * time.Second)
	close(gate)
	waitFor(t, "DeadlineExceeded", func() bool {
		f.clock.Advance(time.Millisecond)
		p := f.status("u1")
		return p != nil && p.Status.Phase == v1.PodFailed && p.Status.Reason == "DeadlineExceeded"
	})
	if n := f.rt.startedCount(); n != 0 {
		t.Errorf("%d containers started past the deadline", n)
	}
	f.clock.Advance(time.Minute)
	var n int
	for _, ev := range f.e.Events() {
		if ev.Reason == "DeadlineExceeded" {
			n += int(ev.Count)
		}
	}
	if n != 1 {
		t.Errorf("%d DeadlineExceeded events, want 1: %+v", n, f.e.Events())
	}
}

func TestEngineTerminationMessage(t *testing.T) {
	f := startEngine(t)
	pod := testPod("u1", "job", v1.RestartPolicyAlways)
	pod.Spec.Containers[0].TerminationMessagePath = "/dev/termination-log"
	pod.Spec.Containers[0].TerminationMessagePolicy = v1.TerminationMessageFallbackToLogsOnError
	f.send(pod)
	waitFor(t, "start", func() bool { return f.rt.startedCount() == 1 })
	first := f.rt.started[0]
	src := mountSource(t, first, "/dev/termination-log")
	if err := os.WriteFile(src, []byte("bye: disk full"), 0o644); err != nil {
		t.Fatal(err)
	}
	f.rt.exit(first.ID, 2)
	waitFor(t, "restart", func() bool { return f.rt.startedCount() == 2 })
	second := f.rt.started[1]
	if mountSource(t, second, "/dev/termination-log") == src {
		t.Fatal("the second run shares the first run's message file")
	}
	// The second run leaves an empty file and a log: the log's end is the message.
	if err := os.MkdirAll(filepath.Dir(second.LogPath), 0o755); err != nil {
		t.Fatal(err)
	}
	log := "2026-01-01T00:00:00Z stdout F line one\n2026-01-01T00:00:00Z stderr P broken \n2026-01-01T00:00:00Z stderr F line\n"
	if err := os.WriteFile(second.LogPath, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	f.rt.exit(second.ID, 1)
	waitFor(t, "messages in status", func() bool {
		cs := f.status("u1").Status.ContainerStatuses[0]
		last, cur := cs.LastTerminationState.Terminated, cs.State.Terminated
		if cur == nil && cs.State.Waiting != nil {
			cur, last = last, nil // waiting for the restart: what just ended is lastState
		}
		return cur != nil && cur.Message == "line one\nbroken line\n" && (last == nil || last.Message == "bye: disk full")
	})
}

// A run's message file lies in the pod's state dir itself, with no
// directory per container (two directories less on disk per start); a
// run bound to a file where earlier noderun versions put it (a container
// adopted after an upgrade) still has its message read.
func TestEngineTerminationMessageFiles(t *testing.T) {
	f := startEngine(t)
	pod := testPod("u1", "job", v1.RestartPolicyAlways)
	pod.Spec.Containers[0].TerminationMessagePath = "/dev/termination-log"
	f.send(pod)
	waitFor(t, "start", func() bool { return f.rt.startedCount() == 1 })
	first := f.rt.started[0]
	src := mountSource(t, first, "/dev/termination-log")
	filesDir := PodFilesDir(SandboxDir(f.e.cfg.RunDir, "u1"))
	if filepath.Dir(src) != filesDir {
		t.Errorf("message file %s, want it in %s", src, filesDir)
	}
	podDir := filepath.Join(f.e.cfg.StateDir, "pods", "u1")
	if _, err := os.Stat(filepath.Join(podDir, "containers")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a containers dir in the pod's state dir (%v)", err)
	}
	// As if an earlier noderun had started the run: its file in the
	// pod's state dir.
	if err := os.Remove(src); err != nil {
		t.Fatal(err)
	}
	legacy := filepath.Join(podDir, "termination-message.main.0")
	if err := os.WriteFile(legacy, []byte("from the old layout"), 0o644); err != nil {
		t.Fatal(err)
	}
	f.rt.exit(first.ID, 1)
	waitFor(t, "the message in status", func() bool {
		cs := f.status("u1").Status.ContainerStatuses[0]
		for _, st := range []v1.ContainerState{cs.State, cs.LastTerminationState} {
			if st.Terminated != nil && st.Terminated.Message == "from the old layout" {
				return true
			}
		}
		return false
	})
}

func mountSource(t *testing.T, cfg *ContainerConfig, dest string) string {
	t.Helper()
	for _, m := range cfg.Mounts {
		if m.Destination == dest {
			return m.Source
		}
	}
	t.Fatalf("no mount at %s in %+v", dest, cfg.Mounts)
	return ""
}

func TestEngineNewSandboxRerunsInitContainers(t *testing.T) {
	f := startEngine(t)
	pod := testPod("u1", "web", v1.RestartPolicyAlways)
	pod.Spec.InitContainers = []v1.Container{{Name: "setup", Image: "busybox:1.36"}}
	f.send(pod)
	waitFor(t, "init started", func() bool { return f.rt.startedCount() == 1 })
	f.rt.exit(f.rt.started[0].ID, 0)
	waitFor(t, "app started", func() bool { return f.rt.startedCount() == 2 })
	f.net.breakSandbox("u1")
	f.e.NetworkChanged(SandboxID("u1"))
	waitFor(t, "init container run again", func() bool { return f.startedConfig("setup", 1) != nil })
	if f.startedConfig("main", 1) != nil {
		t.Fatal("the app container restarted before the init container ran again")
	}
	f.rt.exit(f.startedConfig("setup", 1).ID, 0)
	waitFor(t, "app restarted after it", func() bool { return f.startedConfig("main", 1) != nil })
}

func conditionTrue(p *v1.Pod, t v1.PodConditionType) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == t {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}

func TestEngineImagePullBackOffAndPullEvents(t *testing.T) {
	f := startEngine(t)
	f.rt.mu.Lock()
	f.rt.imagePulls, f.rt.imageErr = true, fmt.Errorf("%w: registry.example: connection refused", ErrImagePull)
	f.rt.mu.Unlock()
	f.send(testPod("u1", "web", v1.RestartPolicyAlways))
	waiting := func(reason string) func() bool {
		return func() bool {
			p := f.status("u1")
			return p != nil && p.Status.ContainerStatuses[0].State.Waiting != nil && p.Status.ContainerStatuses[0].State.Waiting.Reason == reason
		}
	}
	waitFor(t, "ErrImagePull", waiting("ErrImagePull"))
	// The worker sets its timer after publishing.
	waitFor(t, "the worker's timer", func() bool { return f.clock.timerIn(time.Second) })
	f.clock.Advance(time.Second)
	waitFor(t, "ImagePullBackOff", waiting("ImagePullBackOff"))
	ensures := func() int { f.rt.mu.Lock(); defer f.rt.mu.Unlock(); return f.rt.ensures }
	if n := ensures(); n != 1 {
		t.Fatalf("%d pull attempts within the 10 s backoff, want 1", n)
	}
	f.rt.mu.Lock()
	f.rt.imageErr = nil
	f.rt.mu.Unlock()
	waitFor(t, "the backoff's timer", func() bool { return f.clock.timerIn(9 * time.Second) })
	f.clock.Advance(9 * time.Second)
	waitFor(t, "started after the backoff", func() bool { return f.rt.startedCount() == 1 })
	if !f.hasEvent("Pulling", `Pulling image "busybox:1.36"`) || !f.hasEvent("Pulled", "Image size: 1234 bytes") || !f.hasEvent("Failed", "Failed to pull image") {
		t.Fatalf("events: %+v", f.e.events.list())
	}
}

func TestEngineImageGCKeepsWhatManifestsAndContainersUse(t *testing.T) {
	clock := newFakeClock()
	f := &engineFixture{rt: newFakeRuntime(clock), net: &fakeNetwork{}, clock: clock, snaps: make(chan manifests.Snapshot)}
	dir := t.TempDir()
	f.e = New(Config{
		NodeName: "n1", StateDir: filepath.Join(dir, "state"), RunDir: filepath.Join(dir, "run"), PodLogDir: filepath.Join(dir, "logs"),
		ResolvConf: filepath.Join(dir, "none"), Clock: clock, ImageGCPeriod: 5 * time.Minute,
	}, f.rt, f.net)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.e.Run(ctx, f.snaps, 1) }()
	defer func() { cancel(); <-done }()
	pod := testPod("u1", "web", v1.RestartPolicyAlways)
	pod.Spec.InitContainers = []v1.Container{{Name: "init", Image: "example.com/init:2"}}
	f.send(pod)
	waitFor(t, "init started", func() bool { return f.rt.startedCount() == 1 })
	waitFor(t, "the image GC's ticker", func() bool { return f.clock.timerIn(5 * time.Minute) })
	f.clock.Advance(5 * time.Minute)
	waitFor(t, "image GC", func() bool { f.rt.mu.Lock(); defer f.rt.mu.Unlock(); return f.rt.gcKeep != nil })
	f.rt.mu.Lock()
	keep := f.rt.gcKeep
	f.rt.mu.Unlock()
	for _, want := range []string{"busybox:1.36", "example.com/init:2", "docker.io/library/example.com/init:2"} {
		if !slices.Contains(keep, want) {
			t.Errorf("GC may remove %s; keep = %v", want, keep)
		}
	}
}

// The fallback to the log's end for a termination message follows no link
// planted below the pod log dir (a pod with a hostPath there can): the
// message would show the host file it names.
func TestLogTailFollowsNoLinks(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "ns_pod_uid", "c")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	line := "2026-01-01T00:00:00Z stdout F "
	if err := os.WriteFile(filepath.Join(dir, "0.log"), []byte(line+"the log\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := logTail(root, filepath.Join(dir, "0.log"), 10, 1024); got != "the log\n" {
		t.Errorf("logTail = %q, want the log's line", got)
	}
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte(line+"host secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(dir, "1.log")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Dir(secret), filepath.Join(root, "ns_pod_uid", "d")); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(dir, "1.log"), filepath.Join(root, "ns_pod_uid", "d", "secret")} {
		if got := logTail(root, p, 10, 1024); got != "" {
			t.Errorf("logTail(%s) = %q through a link", p, got)
		}
	}
}

// Pruning a container's old logs follows no link planted below the pod
// log dir (a pod with a hostPath there can plant one) and crosses no
// mount: it removes a planted link, never what the link or mount shows.
func TestPruneLogsFollowsNoLinks(t *testing.T) {
	root, host := t.TempDir(), t.TempDir()
	for _, name := range []string{"0.log", "1.log", "secret"} {
		if err := os.WriteFile(filepath.Join(host, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	w := &podWorker{env: &podEnv{cfg: &Config{PodLogDir: root}}, uid: "u1"}
	pod := testPod("u1", "web", v1.RestartPolicyAlways)
	podDir := w.podLogDir(pod)
	own := filepath.Join(podDir, "main")
	if err := os.MkdirAll(own, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{"0.log": filepath.Join(host, "secret"), "1.log": host} {
		if err := os.Symlink(target, filepath.Join(own, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(host, filepath.Join(podDir, "side")); err != nil {
		t.Fatal(err)
	}
	w.pruneLogs(pod, "side", 5) // a link to a directory in place of a container's
	w.pruneLogs(pod, "main", 5) // planted links among the old runs' logs
	if ents, err := os.ReadDir(own); err != nil || len(ents) != 0 {
		t.Errorf("the links planted as old logs: %v %v, want removed", ents, err)
	}
	if os.Geteuid() == 0 {
		mnt := filepath.Join(podDir, "mounted")
		if err := os.Mkdir(mnt, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount(host, mnt, "", unix.MS_BIND, ""); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) })
		w.pruneLogs(pod, "mounted", 5)
	}
	for _, name := range []string{"0.log", "1.log", "secret"} {
		if _, err := os.Stat(filepath.Join(host, name)); err != nil {
			t.Errorf("pruning the logs reached the host's %s: %v", name, err)
		}
	}
}
