package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

// resolveArgs runs resolveDirs in a subcommand, as reset does, on the
// node flags args, and returns the dir flags after it.
func resolveArgs(t *testing.T, create bool, args ...string) (map[string]string, error) {
	t.Helper()
	got := map[string]string{}
	var rerr error
	app := &cli.App{Flags: flags(), Commands: []*cli.Command{{Name: "sub", Action: func(c *cli.Context) error {
		rerr = resolveDirs(c, create)
		for _, f := range dirFlags {
			got[f] = c.String(f)
		}
		return nil
	}}}}
	if err := app.Run(append(append([]string{"noderun"}, args...), "sub")); err != nil {
		t.Fatal(err)
	}
	return got, rerr
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

// reset removes what run makes: every path of the layout under the state
// or run dir is among the names reset owns there, or the admin's inputs.
func TestResetOwnsEveryPathOfTheLayout(t *testing.T) {
	l := layout{state: "/s", run: "/r", podLogs: "/l", socket: "/r/noderun.sock", images: "/s/images"}
	for _, p := range []string{
		l.sources(), l.apiDir(), l.cniCache(), l.driverBin(), l.importLedger(), l.seccomp(), l.registryAuth(), l.images,
		l.apiServerFile(), l.sandboxes(), l.nsHolder(), l.runc(), l.tmpMounts(), l.collectorSocket(), l.socket,
	} {
		dir, rest, _ := strings.Cut(strings.TrimPrefix(p, "/"), "/")
		name, _, _ := strings.Cut(rest, "/")
		owned := map[string][]string{"s": append(stateOwned, stateInputs...), "r": runOwned}[dir]
		if !slices.Contains(owned, name) {
			t.Errorf("%s: reset does not remove %s", p, name)
		}
	}
}
