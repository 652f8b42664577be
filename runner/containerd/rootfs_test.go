package containerd

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/mount"
	"github.com/containerd/containerd/oci"
	"github.com/moby/sys/mountinfo"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/internal/testenv"
	"github.com/noderun/noderun/runner"
)

func TestInsideMount(t *testing.T) {
	overlay := mount.Mount{Type: "overlay", Source: "overlay", Options: []string{"index=off", "workdir=/s/2/work", "upperdir=/s/2/fs", "lowerdir=/s/1/fs"}}
	long := overlay
	long.Options = append([]string{strings.Repeat("x", maxInsideMountData)}, overlay.Options...)
	for _, tc := range []struct {
		name   string
		mounts []mount.Mount
		spec   oci.Spec
		want   bool
	}{
		{"an overlay", []mount.Mount{overlay}, oci.Spec{}, true},
		{"options longer than a mount takes", []mount.Mount{long}, oci.Spec{}, false},
		{"a bind (another snapshotter)", []mount.Mount{{Type: "bind", Source: "/s/2/fs", Options: []string{"rbind", "rw"}}}, oci.Spec{}, false},
		{"two mounts", []mount.Mount{overlay, overlay}, oci.Spec{}, false},
		{"no mount", nil, oci.Spec{}, false},
		{"an SELinux mount label", []mount.Mount{overlay}, oci.Spec{Linux: &specs.Linux{MountLabel: "system_u:object_r:container_file_t:s0"}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, ok := insideMount(tc.mounts, &tc.spec)
			if ok != tc.want {
				t.Fatalf("inside %t, want %t", ok, tc.want)
			}
			if ok && (m.Destination != "/" || m.Type != "overlay" || strings.Join(m.Options, ",") != strings.Join(overlay.Options, ",")) {
				t.Errorf("mount %+v, want the overlay at /", m)
			}
		})
	}
}

func TestRuncBefore12(t *testing.T) {
	for line, want := range map[string]bool{
		"runc version 1.1.5+ds1":  true,
		"runc version 1.1.15":     true,
		"runc version 1.2.8":      false,
		"runc version 1.5.3":      false,
		"runc version 2.0.0":      false,
		"runc version 1.2.0-rc.1": false,
		"runc version unknown":    false,
		"":                        false,
	} {
		if got := runcBefore12(line); got != want {
			t.Errorf("runcBefore12(%q) = %t, want %t", line, got, want)
		}
	}
}

// TestRootfsMountedInsideTheContainer starts containers on a real
// containerd and runc: the rootfs is the container's snapshot, mounted in
// its own mount namespace and nowhere on the host, writable or read-only as
// asked; with options too long for runc it is mounted on the host as
// before. Removal takes the snapshot.
func TestRootfsMountedInsideTheContainer(t *testing.T) {
	rt := testRuntime(t)
	ctx := rt.ctx(context.Background())
	yes := true
	for _, tc := range []struct {
		name         string
		readOnly     bool
		maxData      int
		wantOnHost   bool
		wantRootOpts string
	}{
		{"writable", false, maxInsideMountData, false, "rw"},
		{"readOnlyRootFilesystem", true, maxInsideMountData, false, "ro"},
		{"options too long: on the host", false, 0, true, "rw"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func(n int) { maxInsideMountData = n }(maxInsideMountData)
			maxInsideMountData = tc.maxData
			name := strings.NewReplacer(" ", "-", ":", "").Replace(strings.ToLower(tc.name))
			cfg := testConfig(t, rt, name, "sh", "-c", "echo hi > /written 2>/dev/null; exec sleep 3600")
			if tc.readOnly {
				cfg.Container.SecurityContext = &v1.SecurityContext{ReadOnlyRootFilesystem: &yes}
			}
			startContainer(t, rt, cfg)
			root := waitRootMount(t, int(loadTask(t, rt, cfg.ID).Pid()))
			if mode, _, _ := strings.Cut(root.Options, ","); root.FSType != "overlay" || mode != tc.wantRootOpts {
				t.Errorf("the container's / is %s %s, want overlay %s", root.FSType, root.Options, tc.wantRootOpts)
			}
			onHost := false
			for _, m := range readMountInfo(t, "/proc/self/mountinfo") {
				onHost = onHost || strings.Contains(m.Mountpoint, "/"+cfg.ID+"/rootfs")
			}
			// runc 1.2 and later cannot mount it inside.
			if want := tc.wantOnHost || !rt.rootfsInside; onHost != want {
				t.Errorf("rootfs on the host's mount table: %t, want %t", onHost, want)
			}

			// What the container wrote is in its snapshot's upper dir.
			ms, err := rt.client.SnapshotService(testSnapshotter).Mounts(ctx, cfg.ID)
			if err != nil {
				t.Fatal(err)
			}
			upper := ""
			for _, o := range ms[0].Options {
				if v, ok := strings.CutPrefix(o, "upperdir="); ok {
					upper = v
				}
			}
			written, err := os.ReadFile(filepath.Join(upper, "written"))
			switch {
			case tc.readOnly && !os.IsNotExist(err):
				t.Errorf("read-only rootfs written: %q, %v", written, err)
			case !tc.readOnly && string(written) != "hi\n":
				t.Errorf("upper dir %s/written: %q, %v; want the container's write", upper, written, err)
			}

			if err := rt.RemoveContainer(context.Background(), cfg.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := rt.client.SnapshotService(testSnapshotter).Stat(ctx, cfg.ID); !errdefs.IsNotFound(err) {
				t.Errorf("snapshot after removal: %v, want not found", err)
			}
		})
	}
}

// readMountInfo parses a mountinfo file (/proc/<pid>/mountinfo).
func readMountInfo(t *testing.T, path string) []*mountinfo.Info {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ms, err := mountinfo.GetMountsFromReader(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	return ms
}

// waitRootMount is the "/" mount of pid's mount namespace once its shell
// has exec'd sleep, so what it was to write is written.
func waitRootMount(t *testing.T, pid int) *mountinfo.Info {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); !strings.HasPrefix(string(cmd), "sleep\x00") {
			continue
		}
		var root *mountinfo.Info
		for _, m := range readMountInfo(t, fmt.Sprintf("/proc/%d/mountinfo", pid)) {
			if m.Mountpoint == "/" {
				root = m // the last mount on / is what the process sees
			}
		}
		return root
	}
	t.Fatalf("process %d never exec'd sleep", pid)
	return nil
}

// TestRootfsInsideKeepsBidirectionalPropagation: with the rootfs mounted in
// the container's namespace (root propagation rshared), a mount the
// container makes below a Bidirectional volume still reaches the host, and
// its rootfs still does not.
func TestRootfsInsideKeepsBidirectionalPropagation(t *testing.T) {
	rt := testRuntime(t)
	dir := t.TempDir()
	testenv.SharedMount(t, dir) // CRI requires the source on a shared (or slave) mount
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(sub, unix.MNT_DETACH) })
	yes := true
	cfg := testConfig(t, rt, "bidirectional", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /host/sub && touch /host/sub/from-container; exec sleep 3600")
	cfg.Container.SecurityContext = &v1.SecurityContext{Privileged: &yes}
	cfg.Mounts = []runner.Mount{{Source: dir, Destination: "/host", Propagation: v1.MountPropagationBidirectional}}
	startContainer(t, rt, cfg)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(sub, "from-container")); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the container's mount below the Bidirectional volume never reached the host: %v", err)
		}
	}
	for _, m := range readMountInfo(t, "/proc/self/mountinfo") {
		if strings.Contains(m.Mountpoint, "/"+cfg.ID+"/rootfs") {
			t.Errorf("rootfs on the host's mount table: %s", m.Mountpoint)
		}
	}
}
