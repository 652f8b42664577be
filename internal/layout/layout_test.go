package layout

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// resolveArgs runs Resolve on the dir flags args give (the last of each
// wins, as on a command line) and returns the dirs after it by flag.
func resolveArgs(t *testing.T, create bool, args ...string) (map[string]string, error) {
	t.Helper()
	var f Flags
	dirs := map[string]*string{"state-dir": &f.State, "run-dir": &f.Run, "pod-log-dir": &f.PodLogs}
	for i := 0; i+1 < len(args); i += 2 {
		*dirs[strings.TrimPrefix(args[i], "--")] = args[i+1]
	}
	l, err := Resolve(f, create)
	return map[string]string{"state-dir": l.State, "run-dir": l.Run, "pod-log-dir": l.PodLogs}, err
}

// The mount table names mounts by their resolved absolute paths: a dir
// given relative or through a link is set to that, and made if missing.
func TestResolveDirsRelativeAndLinked(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "data", "noderun")
	if err := os.MkdirAll(real, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, filepath.Join(dir, "state")); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	got, err := resolveArgs(t, true, "--state-dir", "state", "--run-dir", "./run", "--pod-log-dir", filepath.Join(dir, "logs"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"state-dir": real, "run-dir": filepath.Join(dir, "run"), "pod-log-dir": filepath.Join(dir, "logs")}
	for f, w := range want {
		if got[f] != w {
			t.Errorf("--%s: %q, want %q", f, got[f], w)
		}
		if st, err := os.Stat(w); err != nil || !st.IsDir() {
			t.Errorf("--%s: %v, want it made", f, err)
		}
	}
}

// A system directory or two dirs overlapping are refused, naming the flag;
// reset's resolution (create false) makes nothing.
func TestResolveDirsRefuses(t *testing.T) {
	dir := t.TempDir()
	state, run, logs := filepath.Join(dir, "s"), filepath.Join(dir, "r"), filepath.Join(dir, "l")
	for _, tt := range []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"root", []string{"--state-dir", "/"}, "--state-dir /: the root directory"},
		{"var", []string{"--state-dir", "/var"}, "--state-dir /var: a top-level directory"},
		{"data partition", []string{"--state-dir", "/data"}, "--state-dir /data: a top-level directory"},
		{"var lib", []string{"--state-dir", "/var/lib/"}, "--state-dir /var/lib/: a system directory"},
		{"run", []string{"--run-dir", "/run"}, "--run-dir /run: a top-level directory"},
		{"var run", []string{"--run-dir", "/var/run"}, "--run-dir /var/run: a top-level directory"}, // a link to /run
		{"var log", []string{"--pod-log-dir", "/var/log"}, "--pod-log-dir /var/log: a system directory"},
		{"home", []string{"--state-dir", "/home/alice"}, "--state-dir /home/alice: a home directory"},
		{"proc", []string{"--run-dir", "/proc/self"}, "--run-dir /proc/self: on a kernel file system"},
		{"same", []string{"--run-dir", state}, "--state-dir " + state + " and --run-dir " + state + " overlap"},
		{"run in state", []string{"--run-dir", filepath.Join(state, "run")}, "--state-dir " + state + " and --run-dir " + filepath.Join(state, "run") + " overlap"},
		{"state in logs", []string{"--state-dir", filepath.Join(logs, "s")}, "--state-dir " + filepath.Join(logs, "s") + " and --pod-log-dir " + logs + " overlap"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"--state-dir", state, "--run-dir", run, "--pod-log-dir", logs}, tt.args...)
			_, err := resolveArgs(t, false, args...)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%v, want an error with %q", err, tt.wantErr)
			}
		})
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("reset's resolution made %v", ents)
	}
}

// The status socket and the images dir default to their places in the run
// and state dirs as resolved; given, they are kept as given.
func TestResolveDefaults(t *testing.T) {
	dir := t.TempDir()
	f := Flags{State: filepath.Join(dir, "s"), Run: filepath.Join(dir, "r"), PodLogs: filepath.Join(dir, "l")}
	l, err := Resolve(f, true)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "r", "noderun.sock"); l.Socket != want {
		t.Errorf("socket %q, want %q", l.Socket, want)
	}
	if want := filepath.Join(dir, "s", "images"); l.Images != want {
		t.Errorf("images %q, want %q", l.Images, want)
	}
	f.Socket, f.Images = "/elsewhere/s.sock", "/elsewhere/images"
	if l, err = Resolve(f, false); err != nil || l.Socket != f.Socket || l.Images != f.Images {
		t.Errorf("given: %+v %v, want socket %q and images %q", l, err, f.Socket, f.Images)
	}
}

// reset removes what run makes: every path of the layout under the state
// or run dir is among the names reset owns there, or the admin's inputs.
func TestResetOwnsEveryPathOfTheLayout(t *testing.T) {
	l := Layout{State: "/s", Run: "/r", PodLogs: "/l", Socket: "/r/noderun.sock", Images: "/s/images"}
	for _, p := range []string{
		l.Sources(), l.APIDir(), l.CNICache(), l.DriverBin(), l.ImportLedger(), l.Seccomp(), l.RegistryAuth(), l.Images,
		l.APIServerFile(), l.Sandboxes(), l.NSHolder(), l.Runc(), l.TmpMounts(), l.CollectorSocket(), l.Socket,
	} {
		dir, rest, _ := strings.Cut(strings.TrimPrefix(p, "/"), "/")
		name, _, _ := strings.Cut(rest, "/")
		owned := map[string][]string{"s": append(stateOwned, stateInputs...), "r": runOwned}[dir]
		if !slices.Contains(owned, name) {
			t.Errorf("%s: reset does not remove %s", p, name)
		}
	}
}
