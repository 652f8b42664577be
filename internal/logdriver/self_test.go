package logdriver

import (
	"bytes"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
)

// The embedded driver's path when it installs; noderun's own binary when
// the build embeds none (quietly) or the installed copy does not run
// (saying so).
func TestInstallOrSelf(t *testing.T) {
	state := t.TempDir()
	for _, tc := range []struct {
		name  string
		path  string
		err   error
		want  string
		warns bool
	}{
		{"installed", filepath.Join(state, "bin", "log-driver-0123"), nil, filepath.Join(state, "bin", "log-driver-0123"), false},
		{"none embedded", "", nil, "/self", false},
		{"does not run", "", errors.New("log driver does not run: permission denied"), "/self", true},
	} {
		var out bytes.Buffer
		var dir string
		got := installOrSelf(slog.New(slog.NewTextHandler(&out, nil)), func(d string) (string, error) {
			dir = d
			return tc.path, tc.err
		}, filepath.Join(state, "bin"), "/self")
		if got != tc.want {
			t.Errorf("%s: driver %q, want %q", tc.name, got, tc.want)
		}
		if dir != filepath.Join(state, "bin") {
			t.Errorf("%s: installed into %q, want %s", tc.name, dir, filepath.Join(state, "bin"))
		}
		if warned := strings.Contains(out.String(), "level=WARN"); warned != tc.warns {
			t.Errorf("%s: warned %t, want %t: %q", tc.name, warned, tc.warns, out.String())
		}
	}
}
