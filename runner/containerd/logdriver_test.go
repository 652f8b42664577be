package containerd

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/noderun/noderun/crilog"
	"github.com/noderun/noderun/internal/testenv"
)

// A log driver that cannot create its log (a directory name over NAME_MAX)
// fails the start, with the container removed, rather than leaving a
// container whose output nobody reads.
func TestStartFailsWhenTheLogDriverFails(t *testing.T) {
	testenv.SkipIfEmulated(t, shimRunsTestBinary)
	rt := testRuntime(t)
	cfg := testConfig(t, rt, "nolog", "echo", "hello")
	cfg.LogPath = filepath.Join(t.TempDir(), strings.Repeat("x", 300), "0.log")
	_, err := rt.StartContainer(t.Context(), cfg)
	if err == nil || !strings.Contains(err.Error(), "log driver for nolog") || !strings.Contains(err.Error(), crilog.SyslogTag) {
		t.Fatalf("StartContainer = %v, want the log driver's failure", err)
	}
	if _, err := rt.client.LoadContainer(rt.ctx(t.Context()), cfg.ID); err == nil {
		t.Error("the container was left behind")
	}
}
