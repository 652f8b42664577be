package volume

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
)

// hostileVolume is a volume in which a container planted links, next to a
// "host" directory holding a file it wants.
func hostileVolume(t *testing.T) (vol, host string) {
	t.Helper()
	dir := t.TempDir()
	vol, host = filepath.Join(dir, "vol"), filepath.Join(dir, "host")
	for _, d := range []string{vol, host, filepath.Join(vol, "real", "deep")} {
		if err := os.MkdirAll(d, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(vol, 0o777); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{
		"root":    "/",
		"hostdir": host,
		"up":      "..",
		"inside":  "real",
		"abs-in":  filepath.Join(vol, "real"),
		"selfref": "/proc/self/root",
	} {
		if err := os.Symlink(target, filepath.Join(vol, link)); err != nil {
			t.Fatal(err)
		}
	}
	return vol, host
}

func TestOpenSubPathRefusesEscapes(t *testing.T) {
	vol, host := hostileVolume(t)
	for _, sub := range []string{"root", "hostdir", "hostdir/new", "up", "up/host", "abs-in", "selfref", "root/etc"} {
		h, err := openSubPath(vol, sub)
		if err == nil {
			h.Close()
			t.Errorf("subPath %q resolved (to %s), want an escape error", sub, h.Name())
			continue
		}
		if !errors.Is(err, errEscapes) {
			t.Errorf("subPath %q: %v, want %v", sub, err, errEscapes)
		}
	}
	if _, err := os.Stat(filepath.Join(host, "new")); !os.IsNotExist(err) {
		t.Errorf("a directory was created through a link on the host side: %v", err)
	}
}

func TestOpenSubPathInsideVolume(t *testing.T) {
	vol, _ := hostileVolume(t)
	for sub, want := range map[string]string{
		"real/deep":     filepath.Join(vol, "real", "deep"),
		"inside/deep":   filepath.Join(vol, "real", "deep"),      // a link that stays inside is followed, as by the kubelet
		"fresh/a/b":     filepath.Join(vol, "fresh", "a", "b"),   // created
		"inside/made/x": filepath.Join(vol, "real", "made", "x"), // created
	} {
		h, err := openSubPath(vol, sub)
		if err != nil {
			t.Errorf("subPath %q: %v", sub, err)
			continue
		}
		var got, exp unix.Stat_t
		if err := unix.Fstat(int(h.Fd()), &got); err != nil {
			t.Fatal(err)
		}
		h.Close()
		if err := unix.Stat(want, &exp); err != nil {
			t.Fatalf("subPath %q: %s missing: %v", sub, want, err)
		}
		if got.Ino != exp.Ino {
			t.Errorf("subPath %q opened inode %d, want %s (%d)", sub, got.Ino, want, exp.Ino)
		}
		if created := sub[0] == 'f' || sub[len(sub)-1] == 'x'; created && exp.Mode&0o777 != 0o777 {
			t.Errorf("subPath %q: %s has mode %o, want the volume's 777", sub, want, exp.Mode&0o777)
		}
	}
}

// The pinned bind shows the resolved directory even after the container
// swaps the path for a link.
func TestBindSubPathPinsTarget(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount")
	}
	vol, _ := hostileVolume(t)
	target := filepath.Join(t.TempDir(), "pins", "0")
	if err := PinSubPath(vol, "real", target); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = UnmountAll(filepath.Dir(target)) })
	if err := os.WriteFile(filepath.Join(vol, "real", "marker"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(vol, "real"), filepath.Join(vol, "moved")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/", filepath.Join(vol, "real")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(target, "marker")); err != nil {
		t.Errorf("pinned subPath lost its directory: %v", err)
	}
	if err := PinSubPath(vol, "real", target); !errors.Is(err, errEscapes) {
		t.Errorf("re-pinning through the planted link: %v, want %v", err, errEscapes)
	}
	if err := UnmountAll(filepath.Dir(target)); err != nil {
		t.Fatal(err)
	}
	if left, err := mountsUnder(filepath.Dir(target)); err != nil || len(left) != 0 {
		t.Errorf("mounts left: %v %v", left, err)
	}
}

func TestWritePayloadNeverFollowsPlantedLinks(t *testing.T) {
	dir := t.TempDir()
	vol := filepath.Join(dir, "podinfo")
	shadow := filepath.Join(dir, "shadow")
	if err := os.WriteFile(shadow, []byte("root:secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	payload := map[string]PayloadFile{"labels": {Data: []byte("app=\"web\"\n"), Mode: 0o644}, "sub/name": {Data: []byte("web"), Mode: 0o600}}
	if err := WritePayload(vol, payload, -1); err != nil {
		t.Fatal(err)
	}
	assertFile(t, filepath.Join(vol, "labels"), "app=\"web\"\n", 0o644)
	assertFile(t, filepath.Join(vol, "sub", "name"), "web", 0o600)
	gen := currentGenerationOf(t, vol)

	// Unchanged content keeps the generation.
	if err := WritePayload(vol, payload, -1); err != nil {
		t.Fatal(err)
	}
	if g := currentGenerationOf(t, vol); g != gen {
		t.Errorf("unchanged payload made a new generation %s (was %s)", g, gen)
	}

	// What a container with a writable mount did before noderun mounted
	// these read-only: every name is a link to the host's file.
	for _, p := range []string{"labels", gen + "/labels", gen + "/sub"} {
		if err := os.RemoveAll(filepath.Join(vol, p)); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(shadow, filepath.Join(vol, p)); err != nil {
			t.Fatal(err)
		}
	}
	if err := WritePayload(vol, payload, -1); err != nil {
		t.Fatal(err)
	}
	assertFile(t, shadow, "root:secret\n", 0o600)
	assertFile(t, filepath.Join(vol, "labels"), "app=\"web\"\n", 0o644)
	assertFile(t, filepath.Join(vol, "sub", "name"), "web", 0o600)
	if _, err := os.Lstat(filepath.Join(vol, gen)); !os.IsNotExist(err) {
		t.Errorf("old generation %s not removed: %v", gen, err)
	}
}

func currentGenerationOf(t *testing.T, vol string) string {
	t.Helper()
	g, err := os.Readlink(filepath.Join(vol, dataLink))
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func assertFile(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != content || fi.Mode().Perm() != mode {
		t.Errorf("%s = %q mode %o, want %q mode %o", path, b, fi.Mode().Perm(), content, mode)
	}
}

func TestApplyFSGroupSkipsLinks(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to chown")
	}
	dir := t.TempDir()
	vol, outside := filepath.Join(dir, "vol"), filepath.Join(dir, "outside")
	for _, d := range []string{filepath.Join(vol, "d")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{outside, filepath.Join(vol, "d", "f")} {
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(outside, filepath.Join(vol, "link")); err != nil {
		t.Fatal(err)
	}
	gid := int64(4242)
	always := v1.FSGroupChangeAlways
	if err := ApplyFSGroup(vol, &v1.PodSecurityContext{FSGroup: &gid, FSGroupChangePolicy: &always}); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]uint32{vol: 0o2775, filepath.Join(vol, "d"): 0o2775, filepath.Join(vol, "d", "f"): 0o660} {
		var st unix.Stat_t
		if err := unix.Stat(path, &st); err != nil {
			t.Fatal(err)
		}
		if st.Gid != uint32(gid) || st.Mode&0o7777 != want {
			t.Errorf("%s: gid %d mode %o, want %d %o", path, st.Gid, st.Mode&0o7777, gid, want)
		}
	}
	var st unix.Stat_t
	if err := unix.Stat(outside, &st); err != nil {
		t.Fatal(err)
	}
	if st.Gid == uint32(gid) || st.Mode&0o7777 != 0o600 {
		t.Errorf("the walk followed a link: outside file gid %d mode %o", st.Gid, st.Mode&0o7777)
	}
	// The link itself gets the group, as by the kubelet's Lchown.
	if err := unix.Lstat(filepath.Join(vol, "link"), &st); err != nil || st.Gid != uint32(gid) {
		t.Errorf("link: gid %d (%v), want %d", st.Gid, err, gid)
	}
}

// OnRootMismatch leaves a volume whose root already has the fsGroup alone,
// and walks one whose root does not.
func TestApplyFSGroupOnRootMismatch(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to chown")
	}
	vol := t.TempDir()
	f := filepath.Join(vol, "f")
	if err := os.WriteFile(f, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	gid := int64(4343)
	policy := v1.FSGroupChangeOnRootMismatch
	sc := &v1.PodSecurityContext{FSGroup: &gid, FSGroupChangePolicy: &policy}
	if err := ApplyFSGroup(vol, sc); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(f, &st); err != nil || st.Gid != uint32(gid) {
		t.Fatalf("first pass with a mismatching root: file gid %d, %v", st.Gid, err)
	}
	// A file the container later gives to another group stays so: the root
	// matches, so there is no walk.
	if err := os.Chown(f, -1, 0); err != nil {
		t.Fatal(err)
	}
	if err := ApplyFSGroup(vol, sc); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(f, &st); err != nil || st.Gid != 0 {
		t.Errorf("OnRootMismatch walked a volume whose root matched: file gid %d, %v", st.Gid, err)
	}
	always := v1.FSGroupChangeAlways
	sc.FSGroupChangePolicy = &always
	if err := ApplyFSGroup(vol, sc); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(f, &st); err != nil || st.Gid != uint32(gid) {
		t.Errorf("Always did not walk: file gid %d, %v", st.Gid, err)
	}
}
