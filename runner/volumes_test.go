package runner

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/manifests"
	"github.com/noderun/noderun/runner/volume"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount")
	}
}

// mountsUnder lists the mount points at or below dir, resolved as the
// mount table names them.
func mountsUnder(dir string) ([]string, error) {
	real, err := volume.ResolvePath(dir)
	if err != nil {
		return nil, err
	}
	ms, err := mountinfo.GetMounts(mountinfo.PrefixFilter(real))
	var out []string
	for _, m := range ms {
		out = append(out, m.Mountpoint)
	}
	return out, err
}

// A state dir reached through a link: a container with a hostPath subPath
// restarts (its old pin is found and replaced), and removing the pod
// unmounts the pin and the Memory emptyDir instead of deleting through
// them into the host path.
func TestStateDirThroughLinkKeepsHostPathData(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	real := filepath.Join(dir, "data-disk", "noderun")
	if err := os.MkdirAll(real, 0o755); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "var-lib-noderun")
	if err := os.Symlink(real, state); err != nil {
		t.Fatal(err)
	}
	subPathPodLifecycle(t, dir, state, real)
}

// A relative state dir is the same case: the mount table has absolute
// paths.
func TestRelativeStateDirKeepsHostPathData(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	t.Chdir(dir)
	subPathPodLifecycle(t, dir, "state", filepath.Join(dir, "state"))
}

// subPathPodLifecycle runs a pod with a hostPath subPath and a Memory
// emptyDir on an engine whose StateDir is state (real once resolved),
// crashes its container, removes its manifest, and checks the host data,
// the restart and that nothing stays mounted.
func subPathPodLifecycle(t *testing.T, dir, state, real string) {
	host := filepath.Join(dir, "host-srv")
	precious := filepath.Join(host, "db", "precious.sqlite")
	if err := os.MkdirAll(filepath.Dir(precious), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(precious, []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = volume.UnmountAll(real) })
	clock := newFakeClock()
	f := &engineFixture{rt: newFakeRuntime(clock), net: &fakeNetwork{}, clock: clock, snaps: make(chan manifests.Snapshot)}
	f.e = New(Config{
		NodeName: "n1", HostIP: "192.0.2.1", StateDir: state, RunDir: filepath.Join(dir, "run"),
		PodLogDir: filepath.Join(dir, "logs"), ResolvConf: filepath.Join(dir, "missing-resolv.conf"), Clock: clock,
		NetworkCheck: 5 * time.Minute,
	}, f.rt, f.net)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.e.Run(ctx, f.snaps, 1) }()
	t.Cleanup(func() { cancel(); <-done })

	pod := testPod("u1", "db", v1.RestartPolicyAlways)
	pod.Spec.Volumes = []v1.Volume{
		{Name: "srv", VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: host}}},
		{Name: "scratch", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{Medium: v1.StorageMediumMemory}}},
	}
	pod.Spec.Containers[0].VolumeMounts = []v1.VolumeMount{
		{Name: "srv", MountPath: "/var/lib/db", SubPath: "db"},
		{Name: "scratch", MountPath: "/scratch"},
	}
	f.send(pod)
	waitFor(t, "first start", func() bool { return f.rt.startedCount() == 1 })
	if m, err := mountsUnder(real); err != nil || len(m) != 2 {
		t.Fatalf("mounts under the state dir while the pod runs: %v %v, want the pin and the tmpfs", m, err)
	}

	f.rt.exit(f.rt.started[0].ID, 1)
	waitFor(t, "the restart after the crash", func() bool { return f.rt.startedCount() == 2 })

	f.send()
	podDir := filepath.Join(real, "pods", "u1")
	waitFor(t, "the pod's removal", func() bool {
		_, err := os.Stat(podDir)
		return os.IsNotExist(err) && f.status("u1") == nil
	})
	if _, err := os.Stat(precious); err != nil {
		t.Errorf("removing the pod reached into the host path: %v", err)
	}
	if m, err := mountsUnder(real); err != nil || len(m) != 0 {
		t.Errorf("mounts left under the state dir: %v %v", m, err)
	}
}

// recursiveReadOnly resolves as the kubelet's resolveRecursiveReadOnly.
func TestRecursiveReadOnly(t *testing.T) {
	mode := func(m v1.RecursiveReadOnlyMode) *v1.RecursiveReadOnlyMode { return &m }
	hostToContainer := v1.MountPropagationHostToContainer
	for _, tc := range []struct {
		name           string
		m              v1.VolumeMount
		supported, rro bool
		wantErr        string
	}{
		{name: "unset", m: v1.VolumeMount{Name: "v", ReadOnly: true}, supported: true},
		{name: "Disabled", m: v1.VolumeMount{Name: "v", ReadOnly: true, RecursiveReadOnly: mode(v1.RecursiveReadOnlyDisabled)}, supported: true},
		{name: "Enabled", m: v1.VolumeMount{Name: "v", ReadOnly: true, RecursiveReadOnly: mode(v1.RecursiveReadOnlyEnabled)}, supported: true, rro: true},
		{name: "IfPossible, can", m: v1.VolumeMount{Name: "v", ReadOnly: true, RecursiveReadOnly: mode(v1.RecursiveReadOnlyIfPossible)}, supported: true, rro: true},
		{name: "IfPossible, cannot", m: v1.VolumeMount{Name: "v", ReadOnly: true, RecursiveReadOnly: mode(v1.RecursiveReadOnlyIfPossible)}},
		{name: "Enabled, cannot", m: v1.VolumeMount{Name: "v", ReadOnly: true, RecursiveReadOnly: mode(v1.RecursiveReadOnlyEnabled)},
			wantErr: `volume "v" requested recursive read-only mode, but it is not supported by the runtime`},
		{name: "not read-only", m: v1.VolumeMount{Name: "v", RecursiveReadOnly: mode(v1.RecursiveReadOnlyEnabled)}, supported: true,
			wantErr: `volume "v" requested recursive read-only mode, but it is not read-only`},
		{name: "propagation", m: v1.VolumeMount{Name: "v", ReadOnly: true, MountPropagation: &hostToContainer, RecursiveReadOnly: mode(v1.RecursiveReadOnlyIfPossible)}, supported: true,
			wantErr: `volume "v" requested recursive read-only mode, but it is not compatible with propagation "HostToContainer"`},
	} {
		rro, err := recursiveReadOnly(tc.m, tc.supported)
		if gotErr := fmt.Sprint(err); tc.wantErr != "" && gotErr != tc.wantErr || tc.wantErr == "" && err != nil || rro != tc.rro {
			t.Errorf("%s: %v, %v; want %v, %q", tc.name, rro, err, tc.rro, tc.wantErr)
		}
	}
}
