package volume

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/noderun/noderun/internal/testenv"
)

// Older kernels lack system calls noderun's volume code prefers: openat2
// (Linux 5.6) and fchmodat2 (6.6). TestVolumesOnOlderKernels runs the
// volume tests again in a child test process in which a seccomp filter
// makes them fail with ENOSYS, as such a kernel does. A child, since a
// filter covers its whole process and cannot be removed.

// denyEnv names, in a child, the system calls to deny ("openat2,fchmodat2").
const denyEnv = "NODERUN_TEST_DENY_SYSCALLS"

func TestMain(m *testing.M) {
	if names := os.Getenv(denyEnv); names != "" {
		if err := denySyscalls(strings.Split(names, ",")); err != nil {
			fmt.Fprintf(os.Stderr, "%s=%s: %v\n", denyEnv, names, err)
			os.Exit(2)
		}
	}
	os.Exit(m.Run())
}

// syscallNumbers: both have the same number on every architecture.
var syscallNumbers = map[string]uint32{"openat2": 437, "fchmodat2": 452}

// auditArch is the seccomp architecture of this build, 0 where none is
// written down here.
func auditArch() uint32 {
	return map[string]uint32{
		"amd64": unix.AUDIT_ARCH_X86_64, "arm64": unix.AUDIT_ARCH_AARCH64, "arm": unix.AUDIT_ARCH_ARM,
		"386": unix.AUDIT_ARCH_I386, "riscv64": unix.AUDIT_ARCH_RISCV64,
	}[runtime.GOARCH]
}

// denySyscalls installs, for every thread of this process, a seccomp
// filter under which the named system calls fail with ENOSYS, and checks
// that they do.
func denySyscalls(names []string) error {
	arch := auditArch()
	if arch == 0 {
		return fmt.Errorf("no seccomp architecture for %s", runtime.GOARCH)
	}
	filter := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 4}, // seccomp_data.arch
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: arch, Jt: 1},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW},
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 0}, // seccomp_data.nr
	}
	for _, name := range names {
		nr, ok := syscallNumbers[name]
		if !ok {
			return fmt.Errorf("unknown system call %q", name)
		}
		filter = append(filter,
			unix.SockFilter{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: nr, Jf: 1},
			unix.SockFilter{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)})
	}
	filter = append(filter, unix.SockFilter{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW})
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return err
	}
	if _, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&prog))); e != 0 {
		return fmt.Errorf("seccomp: %w", e)
	}
	for _, name := range names {
		var err error
		switch name {
		case "openat2":
			var fd int
			if fd, err = unix.Openat2(unix.AT_FDCWD, "/", &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC}); err == nil {
				unix.Close(fd)
			}
		case "fchmodat2":
			// x/sys reports a kernel without it as EOPNOTSUPP.
			if err = unix.Fchmodat(unix.AT_FDCWD, "/", 0o755, unix.AT_SYMLINK_NOFOLLOW); err == unix.EOPNOTSUPP {
				err = unix.ENOSYS
			}
		}
		if err != unix.ENOSYS {
			return fmt.Errorf("%s still answers (%v) under the filter", name, err)
		}
	}
	return nil
}

// volumeTests are what subPath, downwardAPI and fsGroup rest on.
var volumeTests = []string{
	"TestOpenSubPathRefusesEscapes", "TestOpenSubPathInsideVolume", "TestBindSubPathPinsTarget",
	"TestWritePayloadNeverFollowsPlantedLinks", "TestWalkBeneath", "TestRemoveFilesInFollowsNoLinks",
	"TestApplyFSGroupSkipsLinks", "TestApplyFSGroupOnRootMismatch", "TestApplyFSGroupNeverOpensEntries",
}

func TestVolumesOnOlderKernels(t *testing.T) {
	if os.Getenv(denyEnv) != "" {
		t.Skip("already the child")
	}
	testenv.SkipIfEmulated(t, "qemu-user refuses seccomp filters (and lacks openat2 and fchmodat2 anyway)")
	if auditArch() == 0 {
		t.Skipf("no seccomp filter written for %s", runtime.GOARCH)
	}
	for _, k := range []struct{ kernel, deny string }{
		{"5.4", "openat2,fchmodat2"},
		{"6.1", "fchmodat2"},
	} {
		t.Run(k.kernel, func(t *testing.T) {
			args := []string{"-test.run=^(" + strings.Join(volumeTests, "|") + ")$", "-test.v", "-test.count=1"}
			if testing.Short() {
				args = append(args, "-test.short")
			}
			cmd := exec.Command(os.Args[0], args...)
			cmd.Env = append(os.Environ(), denyEnv+"="+k.deny)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("with %s denied: %v\n%s", k.deny, err, out)
			}
			for _, name := range volumeTests {
				if !strings.Contains(string(out), "--- PASS: "+name+" ") && !strings.Contains(string(out), "--- SKIP: "+name+" ") {
					t.Errorf("with %s denied, %s did not run\n%s", k.deny, name, out)
				}
			}
			t.Logf("with %s denied:\n%s", k.deny, out)
		})
	}
}
