package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
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
	SkipIfEmulated(t, "it runs itself again: the kernel cannot execute this foreign-architecture test binary again without binfmt_misc")
	for _, tc := range []struct{ ci, want string }{{"", "--- SKIP"}, {"true", "--- FAIL"}} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestRequire$", "-test.v")
		cmd.Env = append(os.Environ(), "TESTENV_CHILD=1", "CI="+tc.ci)
		out, _ := cmd.CombinedOutput()
		if !strings.Contains(string(out), tc.want) || !strings.Contains(string(out), "missing prerequisite: a unicorn") {
			t.Errorf("CI=%q: want %s naming the prerequisite, got:\n%s", tc.ci, tc.want, out)
		}
	}
}

// Natively (make test), Emulated is false; under qemu-user on an x86_64
// kernel (make test-cross), true.
func TestEmulated(t *testing.T) {
	kernel, err := os.ReadFile("/proc/sys/kernel/arch")
	if err != nil || strings.TrimSpace(string(kernel)) != "x86_64" {
		t.Skipf("the expectation is known only on an x86_64 kernel (kernel.arch %q, %v)", kernel, err)
	}
	if want := runtime.GOARCH != "amd64"; Emulated() != want {
		t.Errorf("Emulated() = %t for GOARCH %s on an x86_64 kernel, want %t", Emulated(), runtime.GOARCH, want)
	}
}

// StartWithPID hands out the pid a process just left.
func TestStartWithPID(t *testing.T) {
	Require(t, os.Geteuid() == 0, "root (to set the next pid)")
	ReusePID(t, func() bool {
		first := exec.Command("sleep", "60")
		if err := first.Start(); err != nil {
			t.Fatal(err)
		}
		pid := first.Process.Pid
		_ = first.Process.Kill()
		_ = first.Wait()
		WaitGone(t, pid)
		again, ok := StartWithPID(t, pid, "sleep", "60")
		if !ok {
			return false
		}
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err != nil || again.Process.Pid != pid {
			t.Fatalf("pid %d: %q, %v; started as %d", pid, b, err, again.Process.Pid)
		}
		return true
	})
}
