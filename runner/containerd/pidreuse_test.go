package containerd

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/noderun/noderun/internal/testenv"
)

// With a shim that signals by PID (Debian 12's), noderun warns when
// pid_max is the kernel's 32768 and says nothing at systemd's 4194304.
func TestWarnPIDReuse(t *testing.T) {
	path, goVersion, byPID := shimSignalsByPID()
	testenv.Require(t, path != "", "containerd-shim-runc-v2 on PATH")
	if !byPID {
		t.Skipf("%s is built with %s, which signals through a pidfd: nothing to warn of", path, goVersion)
	}
	for _, tc := range []struct {
		pidMax string
		warns  bool
	}{{"32768\n", true}, {"4194304\n", false}} {
		file := filepath.Join(t.TempDir(), "pid_max")
		if err := os.WriteFile(file, []byte(tc.pidMax), 0o644); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		WarnPIDReuse(slog.New(slog.NewTextHandler(&out, nil)), file)
		if got := strings.Contains(out.String(), "set kernel.pid_max to 4194304"); got != tc.warns {
			t.Errorf("pid_max %s: warned %t, want %t; log: %q", strings.TrimSpace(tc.pidMax), got, tc.warns, out.String())
		}
	}
}
