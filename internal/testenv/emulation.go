package testenv

import (
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// Emulated reports whether this process runs under user-mode emulation
// (qemu-user, as `make test-cross` runs the arm64 and armv7 builds): the
// machine uname reports, which the emulator fakes, is not the kernel's own
// architecture.
func Emulated() bool {
	kernel, err := os.ReadFile("/proc/sys/kernel/arch")
	if err != nil {
		return false // an older kernel: taken as native
	}
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return false
	}
	return unix.ByteSliceToString(u.Machine[:]) != strings.TrimSpace(string(kernel))
}

// SkipIfEmulated skips t under user-mode emulation, also under CI=true:
// the emulator, not the machine, lacks what the test needs (why says what).
// The test still runs natively.
func SkipIfEmulated(t testing.TB, why string) {
	t.Helper()
	if Emulated() {
		t.Skipf("under user-mode emulation: %s", why)
	}
}
