package testenv

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The test re-runs itself so that the verdict of Require (skip or fail) can
// be read from outside.
func TestRequire(t *testing.T) {
	if os.Getenv("TESTENV_CHILD") == "1" {
		Require(t, false, "a unicorn")
		return
	}
	for _, tc := range []struct{ ci, want string }{{"", "--- SKIP"}, {"true", "--- FAIL"}} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestRequire$", "-test.v")
		cmd.Env = append(os.Environ(), "TESTENV_CHILD=1", "CI="+tc.ci)
		out, _ := cmd.CombinedOutput()
		if !strings.Contains(string(out), tc.want) || !strings.Contains(string(out), "missing prerequisite: a unicorn") {
			t.Errorf("CI=%q: want %s naming the prerequisite, got:\n%s", tc.ci, tc.want, out)
		}
	}
}
