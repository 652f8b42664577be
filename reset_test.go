package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/noderun/noderun/internal/testenv"
	"github.com/urfave/cli/v2"
)

// A state or run dir holding what noderun does not make there is a flag
// naming another program's directory: reset refuses before it stops or
// removes anything, and names what it found.
func TestResetRefusesForeignContent(t *testing.T) {
	for _, tt := range []struct {
		name, flag, dir string
		foreign         []string
	}{
		{"state", "state-dir", "s", []string{"backups", "customer.db"}},
		{"run", "run-dir", "r", []string{"other.sock"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			state, run := filepath.Join(root, "s"), filepath.Join(root, "r")
			testenv.WriteFile(t, filepath.Join(state, "pods", "uid", "pod.json"), "{}")
			testenv.WriteFile(t, filepath.Join(run, "lock"), "1")
			for _, f := range tt.foreign {
				testenv.WriteFile(t, filepath.Join(root, tt.dir, f), "theirs")
			}
			app := &cli.App{Flags: flags(), Commands: []*cli.Command{resetCommand()}}
			err := app.Run([]string{"noderun", "--state-dir", state, "--run-dir", run, "--pod-log-dir", filepath.Join(root, "l"),
				"--containerd-address", filepath.Join(root, "none.sock"), "--cni-conf-dir", filepath.Join(root, "cni"), "reset"})
			want := "--" + tt.flag + " " + filepath.Join(root, tt.dir) + " holds what noderun did not make: " + strings.Join(tt.foreign, ", ")
			if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "--force") {
				t.Fatalf("reset: %v, want an error with %q and --force", err, want)
			}
			for _, p := range append([]string{filepath.Join(state, "pods", "uid", "pod.json"), filepath.Join(run, "lock")}, tt.foreign...) {
				if !filepath.IsAbs(p) {
					p = filepath.Join(root, tt.dir, p)
				}
				if _, err := os.Stat(p); err != nil {
					t.Errorf("%s: %v, want it left", p, err)
				}
			}
		})
	}
}
