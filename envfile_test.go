package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/noderun/noderun/internal/testenv"
)

// The unit's EnvironmentFile is read as systemd reads it, and the
// process's own environment wins over it.
func TestApplyEnvFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "env")
	testenv.WriteFile(t, file, "# comment\n; another\n\nNODERUN_TEST_A=one\nNODERUN_TEST_B = \"two words\"\nNODERUN_TEST_C='three'\nNODERUN_TEST_SET=file\n")
	for _, k := range []string{"NODERUN_TEST_A", "NODERUN_TEST_B", "NODERUN_TEST_C"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	t.Setenv("NODERUN_TEST_SET", "shell")
	if err := applyEnvFile(file); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"NODERUN_TEST_A": "one", "NODERUN_TEST_B": "two words", "NODERUN_TEST_C": "three", "NODERUN_TEST_SET": "shell"}
	for k, v := range want {
		if got := os.Getenv(k); got != v {
			t.Errorf("%s=%q, want %q", k, got, v)
		}
	}
	if err := applyEnvFile(filepath.Join(t.TempDir(), "none")); err != nil {
		t.Errorf("a missing file: %v, want none (the unit's EnvironmentFile is optional)", err)
	}
	testenv.WriteFile(t, file, "NODERUN_TEST_A=one\nnot an assignment\n")
	if err := applyEnvFile(file); err == nil || !strings.Contains(err.Error(), file+":2: ") {
		t.Errorf("a bad line: %v, want an error naming %s:2", err, file)
	}
}

// reset run from a shell takes the daemon's dirs from the unit's
// EnvironmentFile (here: dirs holding what noderun does not make, which it
// names and refuses, before touching anything).
func TestResetReadsEnvFile(t *testing.T) {
	root := t.TempDir()
	state, run := filepath.Join(root, "s"), filepath.Join(root, "r")
	testenv.WriteFile(t, filepath.Join(state, "customer.db"), "theirs")
	file := filepath.Join(root, "env")
	testenv.WriteFile(t, file, "NODERUN_STATE_DIR="+state+"\nNODERUN_RUN_DIR="+run+"\nNODERUN_POD_LOG_DIR="+filepath.Join(root, "l")+
		"\nNODERUN_CONTAINERD_ADDRESS="+filepath.Join(root, "none.sock")+"\nNODERUN_CNI_CONF_DIR="+filepath.Join(root, "cni")+"\n")
	for _, k := range []string{"NODERUN_STATE_DIR", "NODERUN_RUN_DIR", "NODERUN_POD_LOG_DIR", "NODERUN_CONTAINERD_ADDRESS", "NODERUN_CNI_CONF_DIR"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	if err := applyEnvFile(file); err != nil {
		t.Fatal(err)
	}
	app := &cli.App{Flags: flags(), Commands: []*cli.Command{resetCommand()}}
	err := app.Run([]string{"noderun", "reset"})
	want := "--state-dir " + state + " holds what noderun did not make: customer.db"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("reset: %v, want %q: the state dir from the env file", err, want)
	}
}
