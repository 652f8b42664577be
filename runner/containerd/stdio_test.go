package containerd

import (
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/containerd/oci"
	"golang.org/x/sys/unix"

	"github.com/noderun/noderun/crilog"
)

// A tty container gets a terminal and TERM=xterm, unless its environment
// names a TERM of its own (CRI applies the environment after WithTTY).
func TestWithTerminal(t *testing.T) {
	tests := []struct {
		name     string
		tty      bool
		env      []string
		wantTerm bool
		wantEnv  []string
	}{
		{"no tty", false, []string{"A=1"}, false, []string{"A=1"}},
		{"tty", true, []string{"A=1"}, true, []string{"A=1", "TERM=xterm"}},
		{"tty, TERM set", true, []string{"TERM=vt100"}, true, []string{"TERM=vt100"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := genSpec(t, oci.WithEnv(tc.env), withTerminal(tc.tty))
			env := slices.DeleteFunc(slices.Clone(s.Process.Env), func(e string) bool { return strings.HasPrefix(e, "PATH=") })
			if s.Process.Terminal != tc.wantTerm || !slices.Equal(env, tc.wantEnv) {
				t.Errorf("terminal %v env %q, want %v %q", s.Process.Terminal, env, tc.wantTerm, tc.wantEnv)
			}
		})
	}
}

// The output FIFOs' read ends are opened once their writer (the shim)
// opens them; a task that was not made leaves no open waiting.
func TestFIFOOutputsWait(t *testing.T) {
	dir := t.TempDir()
	paths := [2]string{filepath.Join(dir, "stdout"), filepath.Join(dir, "stderr")}
	for _, p := range paths {
		if err := unix.Mkfifo(p, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	o := openOutputs(paths[0], paths[1], crilog.Target{})
	var writers []*os.File
	for _, p := range paths { // as the shim does while it creates the task
		w, err := os.OpenFile(p, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		writers = append(writers, w)
	}
	files, err := o.wait(true)
	if err != nil || files[0] == nil || files[1] == nil {
		t.Fatalf("wait: %v %v", files, err)
	}
	io.WriteString(writers[1], "to stderr")
	writers[1].Close()
	if b, _ := io.ReadAll(files[1]); string(b) != "to stderr" {
		t.Errorf("stderr's read end read %q", b)
	}
	files[0].Close()
	files[1].Close()
	writers[0].Close()

	o = openOutputs(paths[0], paths[1], crilog.Target{})
	files, err = o.wait(false)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		f.Close()
	}
}
