package containerd

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/mount"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/oci"
	"github.com/fsnotify/fsnotify"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/noderun/noderun/runner"
)

// userRootfs is an image root whose /etc/passwd and /etc/group give app
// its own group plus membership of staff and extra.
func userRootfs(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	files := map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n",
		"etc/group":  "root:x:0:\nwheel:x:10:root\nstaff:x:50:app\napp:x:1000:\nextra:x:3000:nobody,app\n",
	}
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// TestUserOptsResolveLikeCRI checks the process user containerd's CRI
// plugin gives for the user the kubelet passes, against a real passwd and
// group file.
func TestUserOptsResolveLikeCRI(t *testing.T) {
	root := userRootfs(t)
	gid := func(g int64) *int64 { return &g }
	for _, tc := range []struct {
		name    string
		in      runner.ProcessUser
		want    specs.User
		wantErr bool
	}{
		{"name: passwd group and member groups", runner.ProcessUser{User: "app"},
			specs.User{UID: 1000, GID: 1000, AdditionalGids: []uint32{50, 1000, 3000}}, false},
		{"uid found in passwd gets the same", runner.ProcessUser{User: "1000"},
			specs.User{UID: 1000, GID: 1000, AdditionalGids: []uint32{50, 1000, 3000}}, false},
		{"runAsGroup replaces the passwd group", runner.ProcessUser{User: "1000", Group: gid(2000)},
			specs.User{UID: 1000, GID: 2000, AdditionalGids: []uint32{50, 2000, 3000}}, false},
		{"name with runAsGroup", runner.ProcessUser{User: "app", Group: gid(2000)},
			specs.User{UID: 1000, GID: 2000, AdditionalGids: []uint32{50, 2000, 3000}}, false},
		{"uid not in passwd is group 0", runner.ProcessUser{User: "4242"},
			specs.User{UID: 4242, GID: 0, AdditionalGids: []uint32{0}}, false},
		{"root", runner.ProcessUser{User: "0"},
			specs.User{UID: 0, GID: 0, AdditionalGids: []uint32{0, 10}}, false},
		{"Merge adds fsGroup and supplementalGroups, sorted", runner.ProcessUser{User: "app", Groups: []int64{4000, 2000, 50}},
			specs.User{UID: 1000, GID: 1000, AdditionalGids: []uint32{50, 1000, 2000, 3000, 4000}}, false},
		{"Strict skips /etc/group", runner.ProcessUser{User: "app", Groups: []int64{4000, 2000}, Strict: true},
			specs.User{UID: 1000, GID: 1000, AdditionalGids: []uint32{1000, 2000, 4000}}, false},
		{"unknown name", runner.ProcessUser{User: "ghost"}, specs.User{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := append([]oci.SpecOpts{oci.WithRootFSPath(root)}, userOpts(tc.in)...)
			ctx := namespaces.WithNamespace(context.Background(), "test")
			s, err := oci.GenerateSpec(ctx, nil, &containers.Container{ID: "c1"}, opts...)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("user %+v: no error, spec user %+v", tc.in, s.Process.User)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := s.Process.User
			if got.UID != tc.want.UID || got.GID != tc.want.GID || !slices.Equal(got.AdditionalGids, tc.want.AdditionalGids) {
				t.Errorf("user = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestUserKeyCoversEverySetting: the user cache must not hand one
// container's resolved user to a container with other settings.
func TestUserKeyCoversEverySetting(t *testing.T) {
	gid := int64(5)
	base := runner.ContainerConfig{Image: runner.ImageConfig{ID: "img@sha256:a"}, User: runner.ProcessUser{User: "app"}}
	variants := []func(*runner.ContainerConfig){
		func(c *runner.ContainerConfig) { c.Image.ID = "img@sha256:b" },
		func(c *runner.ContainerConfig) { c.User.User = "1000" },
		func(c *runner.ContainerConfig) { c.User.Group = &gid },
		func(c *runner.ContainerConfig) { c.User.Groups = []int64{5} },
		func(c *runner.ContainerConfig) { c.User.Strict = true },
	}
	seen := map[string]int{userKey(&base): -1}
	for i, change := range variants {
		cfg := base
		change(&cfg)
		k := userKey(&cfg)
		if j, dup := seen[k]; dup {
			t.Errorf("variant %d has the same key as %d: %q", i, j, k)
		}
		seen[k] = i
	}
}

func TestUserLabelRoundTrip(t *testing.T) {
	for _, u := range []specs.User{
		{UID: 1000, GID: 1000, AdditionalGids: []uint32{50, 1000, 3000}},
		{UID: 0, GID: 0},
	} {
		got := userFromLabel(encodeUser(u))
		if got == nil || got.UID != int64(u.UID) || got.GID != int64(u.GID) || len(got.SupplementalGroups) != len(u.AdditionalGids) {
			t.Fatalf("%+v -> %q -> %+v", u, encodeUser(u), got)
		}
		for i, g := range u.AdditionalGids {
			if got.SupplementalGroups[i] != int64(g) {
				t.Errorf("%+v -> %+v", u, got)
			}
		}
	}
	for _, bad := range []string{"", "1000", "x:1:2"} {
		if got := userFromLabel(bad); got != nil {
			t.Errorf("label %q -> %+v, want no user", bad, got)
		}
	}
}

// tempMountsIn has containerd's client mount under a fresh dir for the
// rest of the test, and reports each mount point made there.
func tempMountsIn(t *testing.T) (dir string, made func() []string) {
	t.Helper()
	dir = filepath.Join(t.TempDir(), "tmpmounts")
	if _, err := UseTempMountDir(dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mount.SetTempMountLocation(os.TempDir()) })
	w, err := fsnotify.NewWatcher()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	if err := w.Add(dir); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var names []string
	go func() {
		for ev := range w.Events {
			if ev.Has(fsnotify.Create) {
				mu.Lock()
				names = append(names, filepath.Base(ev.Name))
				mu.Unlock()
			}
		}
	}()
	return dir, func() []string {
		time.Sleep(100 * time.Millisecond) // events still on their way
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(names)
	}
}

// Containers of one image and user created at once look the user up in
// the image once: one rootfs mount for passwd, one for group, not two for
// each.
func TestUserLookedUpOnceForABurst(t *testing.T) {
	rt := testRuntime(t)
	_, made := tempMountsIn(t)
	const n = 6
	cfgs := make([]*runner.ContainerConfig, n)
	for i := range cfgs {
		cfgs[i] = testConfig(t, rt, fmt.Sprintf("burst-%d", i), "true")
	}
	errs := make(chan error, n)
	for _, cfg := range cfgs {
		go func() {
			_, err := rt.CreateContainer(context.Background(), cfg, nil)
			errs <- err
		}()
	}
	for range cfgs {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	// Each spec has the user the one lookup found: root, in group 0.
	want := rt.users[userKey(cfgs[0])]
	if want.UID != 0 || want.GID != 0 || !slices.Contains(want.AdditionalGids, 0) {
		t.Errorf("looked up %+v, want uid 0, gid 0, in group 0", want)
	}
	ctx := namespaces.WithNamespace(context.Background(), testNamespace)
	for _, cfg := range cfgs {
		c, err := rt.client.LoadContainer(ctx, cfg.ID)
		if err != nil {
			t.Fatal(err)
		}
		spec, err := c.Spec(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := spec.Process.User; got.UID != want.UID || got.GID != want.GID || !slices.Equal(got.AdditionalGids, want.AdditionalGids) {
			t.Errorf("%s: user %+v, want %+v", cfg.ID, got, want)
		}
	}
	for _, cfg := range cfgs {
		if err := rt.RemoveContainer(context.Background(), cfg.ID); err != nil {
			t.Error(err)
		}
	}
	if got := made(); len(got) != 2 {
		t.Errorf("%d containers made %d rootfs mounts (%v), want 2: passwd and group once", n, len(got), got)
	}
}

// A mount left in the temp mount dir (noderun killed while it read an
// image's passwd) is removed at the next start.
func TestUseTempMountDirRemovesLeftovers(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tmpmounts")
	left := filepath.Join(dir, "containerd-mount123")
	if err := os.MkdirAll(left, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", left, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(left, unix.MNT_DETACH) })
	t.Cleanup(func() { _ = mount.SetTempMountLocation(os.TempDir()) })
	warnings, err := UseTempMountDir(dir)
	if err != nil || len(warnings) > 0 {
		t.Fatalf("UseTempMountDir: %v, %v", warnings, err)
	}
	if _, err := os.Stat(left); !os.IsNotExist(err) {
		t.Fatalf("the mount left behind: %v, want it unmounted and removed", err)
	}
}
