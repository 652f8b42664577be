package containerd

import (
	"slices"
	"strings"
	"testing"

	"github.com/containerd/containerd/oci"
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
