package testenv

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
)

// ParentPID returns a process's parent: for a container's PID 1, its
// containerd shim, which tests stop to stall it.
func ParentPID(t testing.TB, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the command name, which may hold spaces and ')'.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		t.Fatalf("/proc/%d/stat: %v", pid, err)
	}
	return ppid
}
