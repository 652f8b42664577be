package containerd

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	ctrd "github.com/containerd/containerd"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/noderun/noderun/internal/testenv"
	"github.com/noderun/noderun/runner"
	"github.com/noderun/noderun/runner/containerd/daemon"
)

const testImage = "docker.io/library/busybox:test"

// shimRunsTestBinary is why tests that start a task skip under user-mode
// emulation (make test-cross).
const shimRunsTestBinary = "containerd's shim (a host binary) starts this test binary as the " +
	"containers' log driver, and the kernel cannot execute a foreign-architecture binary without binfmt_misc"

// testRuntime is a Runtime on a fresh private containerd holding the
// busybox test image.
func testRuntime(t *testing.T) *Runtime {
	t.Helper()
	rt, _ := testRuntimeDaemon(t)
	return rt
}

// testRuntimeDaemon is testRuntime with the daemon it runs on.
func testRuntimeDaemon(t *testing.T) (*Runtime, *daemon.Process) {
	t.Helper()
	d := startTestDaemon(t)
	c := clientOf(t, d)
	path := filepath.Join(t.TempDir(), "busybox.tar")
	busyboxTar(t, path, testImage)
	if _, err := ImportArchive(context.Background(), c, path, testSnapshotter); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return New(c, testNamespace, filepath.Join(t.TempDir(), "runc"), exe, WithLogger(testLogger(t)), WithAddress(d.Address())), d
}

// testConfig describes a busybox container running args as root in a
// hostNetwork pod of its own, for the test to adjust before starting it.
func testConfig(t *testing.T, rt *Runtime, name string, args ...string) *runner.ContainerConfig {
	t.Helper()
	img, err := rt.EnsureImage(context.Background(), testImage, v1.PullNever)
	if err != nil {
		t.Fatal(err)
	}
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)},
		Spec:       v1.PodSpec{Containers: []v1.Container{{Name: "c", Image: testImage}}},
	}
	cfg := &runner.ContainerConfig{
		ID:           name,
		Pod:          pod,
		Container:    &pod.Spec.Containers[0],
		Image:        img,
		Args:         args,
		Env:          img.Env,
		User:         runner.ProcessUser{User: "0"},
		WorkingDir:   "/",
		Sandbox:      &runner.Sandbox{ID: name, PodUID: string(pod.UID), HostNetwork: true, HostIPC: true, Dir: t.TempDir()},
		CgroupParent: "/noderun-test/pod" + string(pod.UID),
		LogPath:      filepath.Join(t.TempDir(), "c", "0.log"),
		SpecHash:     "hash",
	}
	// Whichever way the test starts and removes it: after its cleanups.
	t.Cleanup(func() { removePodCgroup(cfg.CgroupParent) })
	return cfg
}

// removePodCgroup removes a pod's cgroup and the test root above it where
// empty: runc removes a container's cgroup, not the parents it made.
func removePodCgroup(parent string) {
	for _, dir := range []string{parent, filepath.Dir(parent)} {
		paths, _ := filepath.Glob("/sys/fs/cgroup/*" + dir)
		paths = append(paths, "/sys/fs/cgroup"+dir)
		for _, p := range paths {
			os.Remove(p)
		}
	}
}

// startContainer starts cfg and removes it, and its pod's cgroup, at
// cleanup.
func startContainer(t *testing.T, rt *Runtime, cfg *runner.ContainerConfig) {
	t.Helper()
	testenv.SkipIfEmulated(t, shimRunsTestBinary)
	if _, err := rt.StartContainer(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := rt.RemoveContainer(context.Background(), cfg.ID); err != nil {
			t.Error(err)
		}
		removePodCgroup(cfg.CgroupParent)
	})
}

// containerStatus is the container's status as ListContainers reports it.
func containerStatus(t *testing.T, rt *Runtime, cfg *runner.ContainerConfig) runner.ContainerStatus {
	t.Helper()
	sts, err := rt.ListContainers(context.Background(), string(cfg.Pod.UID))
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range sts {
		if st.ID == cfg.ID {
			return st
		}
	}
	t.Fatalf("container %s not listed", cfg.ID)
	return runner.ContainerStatus{}
}

// loadTask is container id's task, which the test needs.
func loadTask(t *testing.T, rt *Runtime, id string) ctrd.Task {
	t.Helper()
	ctx := rt.ctx(context.Background())
	c, err := rt.client.LoadContainer(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	task, err := c.Task(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	return task
}

// waitExited polls until the container's task has exited.
func waitExited(t *testing.T, rt *Runtime, cfg *runner.ContainerConfig) runner.ContainerStatus {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if st := containerStatus(t, rt, cfg); st.State == runner.StateExited {
			return st
		}
	}
	t.Fatalf("container %s did not exit", cfg.ID)
	return runner.ContainerStatus{}
}
