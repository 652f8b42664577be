package layout

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/noderun/noderun/internal/testenv"
)

// Reset removes noderun's directories but keeps what an admin put in the
// state dir for noderun to read, and never reaches through a mount left
// below them into a host path.
func TestRemoveDirsKeepsInputsAndHostPaths(t *testing.T) {
	if testing.Short() {
		t.Skip("mounts; skipped with -short")
	}
	testenv.Require(t, os.Geteuid() == 0, "root")
	root := t.TempDir()
	state, run, logs := filepath.Join(root, "s"), filepath.Join(root, "r"), filepath.Join(root, "l")
	host := filepath.Join(root, "host")
	testenv.WriteFile(t, filepath.Join(state, "images", "app.tar"), "tar")
	testenv.WriteFile(t, filepath.Join(state, "config.json"), `{"auths":{}}`)
	testenv.WriteFile(t, filepath.Join(state, "pods", "uid", "pod.json"), "{}")
	testenv.WriteFile(t, filepath.Join(state, "lock"), "1")
	if err := os.MkdirAll(filepath.Join(state, "seccomp"), 0o755); err != nil { // empty: not kept
		t.Fatal(err)
	}
	testenv.WriteFile(t, filepath.Join(host, "precious"), "keep me")
	mnt := filepath.Join(run, "pods", "sb", "vol")
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(host, mnt, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) })
	testenv.WriteFile(t, filepath.Join(logs, "other_pod_uid", "c", "0.log"), "another runtime's log")

	var out bytes.Buffer
	kept, err := Layout{State: state, Run: run, PodLogs: logs, Socket: filepath.Join(run, "noderun.sock")}.RemoveDirs(&out)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Join(state, "config.json") + ": put there for noderun to read",
		filepath.Join(state, "images") + ": put there for noderun to read", logs + ": other logs in it"}
	if !slices.Equal(kept, want) {
		t.Errorf("kept %q,\nwant %q", kept, want)
	}
	if b, err := os.ReadFile(filepath.Join(host, "precious")); err != nil || string(b) != "keep me" {
		t.Fatalf("the host path bound below the run dir was reached: %q %v", b, err)
	}
	for _, gone := range []string{run, filepath.Join(state, "pods"), filepath.Join(state, "lock"), filepath.Join(state, "seccomp")} {
		if _, err := os.Stat(gone); !os.IsNotExist(err) {
			t.Errorf("%s: %v, want removed", gone, err)
		}
	}
	if _, err := os.Stat(filepath.Join(state, "images", "app.tar")); err != nil {
		t.Errorf("the admin's image tarball: %v", err)
	}
}

// With --force, reset removes what noderun makes and keeps the rest: a
// link among noderun's names goes, not its target; a foreign link stays;
// a mount noderun did not make stays mounted.
func TestRemoveDirsKeepsForeign(t *testing.T) {
	if testing.Short() {
		t.Skip("mounts; skipped with -short")
	}
	testenv.Require(t, os.Geteuid() == 0, "root")
	root := t.TempDir()
	state, run, logs := filepath.Join(root, "s"), filepath.Join(root, "r"), filepath.Join(root, "l")
	host, theirs := filepath.Join(root, "host"), filepath.Join(root, "theirs")
	testenv.WriteFile(t, filepath.Join(host, "precious"), "keep me")
	testenv.WriteFile(t, filepath.Join(theirs, "precious"), "keep me")
	testenv.WriteFile(t, filepath.Join(state, "pods", "uid", "pod.json"), "{}")
	testenv.WriteFile(t, filepath.Join(state, "lock"), "1")
	testenv.WriteFile(t, filepath.Join(state, ".containerd.json.tmp123"), "{")
	testenv.WriteFile(t, filepath.Join(state, "customer.db"), "theirs")
	for link, target := range map[string]string{filepath.Join(state, "sources"): host, filepath.Join(state, "archive"): host} {
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
	}
	testenv.WriteFile(t, filepath.Join(run, "noderun.sock.tmp", "s"), "")
	for target, src := range map[string]string{filepath.Join(run, "pods", "sb", "vol"): host, filepath.Join(run, "user", "mnt"): theirs} {
		if err := os.MkdirAll(target, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = unix.Unmount(target, unix.MNT_DETACH) })
	}

	kept, err := Layout{State: state, Run: run, PodLogs: logs, Socket: filepath.Join(run, "noderun.sock")}.RemoveDirs(&bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{run + ": not noderun's: user", state + ": not noderun's: archive, customer.db"}
	if !slices.Equal(kept, want) {
		t.Errorf("kept %q,\nwant %q", kept, want)
	}
	for _, p := range []string{filepath.Join(host, "precious"), filepath.Join(theirs, "precious"), filepath.Join(run, "user", "mnt", "precious"),
		filepath.Join(state, "archive", "precious"), filepath.Join(state, "customer.db")} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s: %v, want it left", p, err)
		}
	}
	if m, err := mountinfo.Mounted(filepath.Join(run, "user", "mnt")); err != nil || !m {
		t.Errorf("a mount noderun did not make: mounted %t %v, want it left", m, err)
	}
	ents, _ := os.ReadDir(state)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{"archive", "customer.db"}) {
		t.Errorf("the state dir holds %q, want only what is not noderun's", names)
	}
	for _, gone := range []string{filepath.Join(run, "pods"), filepath.Join(run, "noderun.sock.tmp")} {
		if _, err := os.Lstat(gone); !os.IsNotExist(err) {
			t.Errorf("%s: %v, want removed", gone, err)
		}
	}
}

// CheckOwned names what noderun does not make in the state or run dir,
// counts a crash's temporary files of noderun's names and the admin's
// inputs as noderun's, and lets force through.
func TestCheckOwned(t *testing.T) {
	root := t.TempDir()
	l := Layout{State: filepath.Join(root, "s"), Run: filepath.Join(root, "r")}
	if err := l.CheckOwned(false); err != nil {
		t.Fatalf("missing dirs: %v", err)
	}
	for _, p := range []string{"s/pods/uid/pod.json", "s/.containerd.json.tmp42", "s/image-imports.json.tmp", "s/images/app.tar", "s/config.json", "r/lock"} {
		testenv.WriteFile(t, filepath.Join(root, p), "")
	}
	if err := l.CheckOwned(false); err != nil {
		t.Fatalf("only noderun's: %v", err)
	}
	testenv.WriteFile(t, filepath.Join(root, "r", "other.sock"), "")
	want := "--run-dir " + l.Run + " holds what noderun did not make: other.sock"
	if err := l.CheckOwned(false); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("%v, want an error with %q", err, want)
	}
	if err := l.CheckOwned(true); err != nil {
		t.Errorf("with force: %v", err)
	}
}
