package containerd

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	ctrd "github.com/containerd/containerd"
	taskapi "github.com/containerd/containerd/api/runtime/task/v2"
	"github.com/containerd/containerd/api/types"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/oci"
	"github.com/containerd/containerd/plugin"
	"github.com/containerd/ttrpc"

	"github.com/noderun/noderun/internal/testenv"
	"github.com/noderun/noderun/runner"
	"github.com/noderun/noderun/runner/containerd/daemon"
)

func TestShimGroupName(t *testing.T) {
	if a, b := shimGroupName("pod-a", 4, "b1"), shimGroupName("pod-a", 4, "b1"); a != b {
		t.Fatalf("one sandbox in groups %q and %q", a, b)
	}
	if got := shimGroupName("pod-a", 1, "b1"); got != "noderun-0-b1" {
		t.Errorf("the one group is %q, want noderun-0-b1", got)
	}
	if got := shimGroupName("pod-a", 1, ""); got != "noderun-0" {
		t.Errorf("without a build the group is %q, want noderun-0", got)
	}
	if a, b := shimGroupName("pod-a", 1, "b1"), shimGroupName("pod-a", 1, "b2"); a == b {
		t.Errorf("a new shim build joins the old one's group %q", a)
	}
	seen := map[string]bool{}
	for i := range 64 {
		seen[shimGroupName(fmt.Sprintf("pod-%d", i), 4, "")] = true
	}
	if len(seen) != 4 {
		t.Errorf("64 sandboxes fill %d of 4 groups: %v", len(seen), seen)
	}
}

func TestWithShimGroup(t *testing.T) {
	for _, tc := range []struct {
		name   string
		groups int
		sb     *runner.Sandbox
		want   string
	}{
		{"grouped", 1, &runner.Sandbox{ID: "0a1b2c-web"}, shimGroupName("0a1b2c-web", 1, shimBuild())},
		{"one shim per container", 0, &runner.Sandbox{ID: "0a1b2c-web"}, ""},
		{"no sandbox", 1, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Runtime{shimGroups: tc.groups}
			if got := genSpec(t, r.withShimGroup(tc.sb)).Annotations[shimGroupAnnotation]; got != tc.want {
				t.Errorf("group %q, want %q", got, tc.want)
			}
		})
	}
}

// groupShim is the pid of the shim serving sandbox sb's group.
func groupShim(t *testing.T, rt *Runtime, d *daemon.Process, sb *runner.Sandbox) int {
	t.Helper()
	group := shimGroupName(sb.ID, rt.shimGroups, shimBuild())
	return shimListeningOn(t, d.Address(), testNamespace, shimSocket(d.Address(), testNamespace, group))
}

// plantOrphanTask leaves in the shim of group what a noderun killed during
// a task create can: a task the shim created and holds (a runc container,
// its init waiting to be started) while containerd lists its container
// without a task. It is created by the shim's own API, in a bundle of the
// test's. It returns the task's pid.
func plantOrphanTask(t *testing.T, rt *Runtime, d *daemon.Process, group, id string) int {
	t.Helper()
	ctx := namespaces.WithNamespace(context.Background(), testNamespace)
	img, err := rt.client.GetImage(ctx, testImage)
	if err != nil {
		t.Fatal(err)
	}
	cgroup := "/noderun-test/orphan-" + id
	t.Cleanup(func() { removePodCgroup(cgroup) })
	c, err := rt.client.NewContainer(ctx, id, ctrd.WithSnapshotter(testSnapshotter), ctrd.WithNewSnapshot(id, img),
		ctrd.WithRuntime(plugin.RuntimeRuncV2, nil),
		ctrd.WithNewSpec(oci.WithImageConfig(img), oci.WithProcessArgs("sleep", "3600"), oci.WithCgroup(cgroup),
			oci.WithAnnotations(map[string]string{shimGroupAnnotation: group})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), ctrd.WithSnapshotCleanup) })
	spec, err := c.Spec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bundle := t.TempDir()
	b, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	mounts, err := rt.client.SnapshotService(testSnapshotter).Mounts(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	req := &taskapi.CreateTaskRequest{ID: id, Bundle: bundle}
	for _, m := range mounts {
		req.Rootfs = append(req.Rootfs, &types.Mount{Type: m.Type, Source: m.Source, Options: m.Options})
	}
	conn, err := net.Dial("unix", shimSocket(d.Address(), testNamespace, group))
	if err != nil {
		t.Fatal(err)
	}
	client := ttrpc.NewClient(conn)
	defer client.Close()
	var resp taskapi.CreateTaskResponse
	err = client.Call(ctx, taskServiceV3, "Create", req, &resp)
	if errdefs.IsNotImplemented(errdefs.FromGRPC(err)) {
		err = client.Call(ctx, taskServiceV2, "Create", req, &resp)
	}
	if err != nil {
		t.Fatalf("create task %s in the shim: %v", id, err)
	}
	if !alive(int(resp.Pid)) {
		t.Fatalf("the orphaned task's process %d is not there", resp.Pid)
	}
	return int(resp.Pid)
}

// The pods of a group share one shim, which serves each container as its
// own would (exec, exit codes, removal with the others running). A task
// containerd lost in it (a create cut short) is deleted in the shim when
// its container is removed, which other pods' tasks keep running; a shim
// left with only such a task, once the listed ones are gone, lets go of it
// before stray-shim reaping kills it. Nothing of either task is left.
func TestSharedShimGroup(t *testing.T) {
	rt, d := testRuntimeDaemon(t)
	rt.shimGroups = 1
	first := testConfig(t, rt, "first", "sleep", "3600")
	second := testConfig(t, rt, "second", "sh", "-c", "trap 'exit 7' TERM; while :; do sleep 1; done")
	startContainer(t, rt, first)
	startContainer(t, rt, second)
	shim := groupShim(t, rt, d, first.Sandbox)
	if got := groupShim(t, rt, d, second.Sandbox); got != shim {
		t.Fatalf("the second pod's shim is %d, want the group's %d", got, shim)
	}
	group := shimGroupName(first.Sandbox.ID, 1, shimBuild())

	orphan := plantOrphanTask(t, rt, d, group, "orphan-one")
	if err := rt.RemoveContainer(context.Background(), "orphan-one"); err != nil {
		t.Fatal(err)
	}
	waitGoneProc(t, orphan, "the orphaned task's process after its container's removal")
	if !alive(shim) {
		t.Fatal("the group's shim exited while it serves two pods")
	}
	if st := containerStatus(t, rt, second); st.State != runner.StateRunning {
		t.Fatalf("second pod's container in state %v", st.State)
	}
	if err := rt.StopContainer(context.Background(), second.ID, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if st := waitExited(t, rt, second); st.ExitCode != 7 {
		t.Fatalf("second exited %d, want 7 (its TERM trap)", st.ExitCode)
	}
	if err := rt.RemoveContainer(context.Background(), second.ID); err != nil {
		t.Fatal(err)
	}
	if res := execSync(t, rt, first.ID, 10*time.Second, "echo", "still here"); string(res.Output) != "still here\n" {
		t.Fatalf("exec in the first pod after the second's removal: %q", res.Output)
	}

	// The shim was started for first's task: its bundle goes with it.
	orphan = plantOrphanTask(t, rt, d, group, "orphan-two")
	if err := rt.RemoveContainer(context.Background(), first.ID); err != nil {
		t.Fatal(err)
	}
	if !alive(shim) {
		t.Fatal("the shim exited while it holds a task")
	}
	n, err := ReapStrayShims(context.Background(), rt.client, d.Address(), testNamespace, testLogger(t))
	if err != nil || n != 1 {
		t.Fatalf("reaping killed %d shims (%v), want the group's ended", n, err)
	}
	waitGoneProc(t, orphan, "the orphaned task's process after its shim was reaped")
	waitGoneProc(t, shim, "the group's shim after reaping")
	if _, err := os.Stat(filepath.Join("/run/containerd/runc", testNamespace, "orphan-two")); !os.IsNotExist(err) {
		t.Errorf("runc's state of the orphaned task is left: %v", err)
	}
}

// waitGoneProc waits for process pid to be gone.
func waitGoneProc(t *testing.T, pid int, what string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); alive(pid); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			t.Fatalf("%s: %d (%s) still runs", what, pid, strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
}

// The task creates of one group are made one at a time, so that each
// reaches a shim that serves it. Made at once, containerd's shim starter
// of the second finds the socket the first one's bound and, when its
// connect is not answered within 100 ms (a slow machine: a TCG VM at boot
// did it), takes it for a dead shim's and starts another shim there; the
// first, its socket gone, gets no task and never ends. The shim binary on
// containerd's PATH is wrapped to record when each start runs.
func TestShimGroupCreatesOneAtATime(t *testing.T) {
	real, err := exec.LookPath(shimBinary)
	if err != nil {
		t.Skipf("no %s on PATH", shimBinary)
	}
	dir := t.TempDir()
	starts := filepath.Join(dir, "starts")
	wrapper := fmt.Sprintf(`#!/bin/sh
case " $* " in *" start "*) ;; *) exec %[1]s "$@" ;; esac
echo "begin $(date +%%s%%N)" >> %[2]s
%[1]s "$@"
rc=$?
echo "end $(date +%%s%%N)" >> %[2]s
exit $rc
`, real, starts)
	if err := os.WriteFile(filepath.Join(dir, shimBinary), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))

	rt, d := testRuntimeDaemon(t)
	rt.shimGroups = 1
	const n = 6
	cfgs := make([]*runner.ContainerConfig, n)
	for i := range cfgs {
		cfgs[i] = testConfig(t, rt, fmt.Sprintf("at-once-%d", i), "sleep", "3600")
	}
	errs := make(chan error, n)
	for _, cfg := range cfgs {
		go func() {
			_, err := rt.StartContainer(context.Background(), cfg)
			errs <- err
		}()
	}
	for range cfgs {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(func() {
		for _, cfg := range cfgs {
			if err := rt.RemoveContainer(context.Background(), cfg.ID); err != nil {
				t.Error(err)
			}
		}
	})
	b, err := os.ReadFile(starts)
	if err != nil {
		t.Fatal(err)
	}
	if most, count := overlap(t, string(b)); most != 1 || count != n {
		t.Errorf("%d shim starts, up to %d at once; want %d, one at a time:\n%s", count, most, n, b)
	}

	serving := map[int]bool{}
	for _, cfg := range cfgs {
		serving[testenv.ParentPID(t, int(loadTask(t, rt, cfg.ID).Pid()))] = true
	}
	shims, err := findShims(canonicalAddress(d.Address()), testNamespace)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range shims {
		if !serving[s.pid] {
			t.Errorf("shim %d (started for %s, on %v) serves none of the tasks", s.pid, s.id, s.sockets)
		}
	}
}

// overlap reads "begin <ns>" and "end <ns>" lines and returns how many
// intervals were open at once at most, and how many there were.
func overlap(t *testing.T, log string) (most, count int) {
	t.Helper()
	type edge struct {
		at    int64
		delta int
	}
	var edges []edge
	for _, line := range strings.Split(strings.TrimSpace(log), "\n") {
		var what string
		var at int64
		if _, err := fmt.Sscanf(line, "%s %d", &what, &at); err != nil {
			t.Fatalf("start log line %q: %v", line, err)
		}
		e := edge{at: at, delta: 1}
		if what == "end" {
			e.delta = -1
		} else {
			count++
		}
		edges = append(edges, e)
	}
	// An end and a begin at the same instant do not overlap.
	slices.SortFunc(edges, func(a, b edge) int { return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.delta, b.delta)) })
	open := 0
	for _, e := range edges {
		open += e.delta
		most = max(most, open)
	}
	return most, count
}
