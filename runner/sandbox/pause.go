package sandbox

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/noderun/noderun/runner"
)

// A pod with shareProcessNamespace needs a PID 1 that holds its PID
// namespace and reaps the orphans in it, which the pause container is under
// CRI. noderun starts itself as that process ("noderun pause ROOT", dispatched by main) in a new PID
// namespace. The process gives up everything a container in its namespace
// could reach through /proc/1: it chroots into an empty directory, becomes
// nobody with no capabilities and is not dumpable.

const (
	pauseUID     = 65534 // nobody
	pauseRootDir = "pause-root"
	pausePIDFile = "pause.pid"
)

// RunPause is the pause process's main: it waits for SIGTERM and reaps.
func RunPause(root string) error {
	if err := unix.Chroot(root); err != nil {
		return fmt.Errorf("chroot %s: %w", root, err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	if err := unix.Setgroups(nil); err != nil {
		return err
	}
	// Raw syscalls so every thread of the runtime changes at once.
	if err := syscall.Setgid(pauseUID); err != nil {
		return err
	}
	if err := syscall.Setuid(pauseUID); err != nil {
		return err
	}
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return err
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, unix.SIGCHLD, unix.SIGTERM, unix.SIGINT)
	for sig := range sigs {
		if sig != unix.SIGCHLD {
			return nil
		}
		for {
			var ws unix.WaitStatus
			if pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
	return nil
}

// ensurePause finds the pod's pause process or starts one, and pins its PID
// namespace at sb.PIDNSPath(). A pause that died took its namespace (and
// every process in it) along; a new one means a new namespace.
func ensurePause(sb *runner.Sandbox) error {
	if pausePID(sb) > 0 {
		return nil
	}
	if err := stopPause(sb); err != nil {
		return err
	}
	root := filepath.Join(sb.Dir, pauseRootDir)
	if err := os.MkdirAll(root, 0o555); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(self, "pause", root)
	// A session of its own: it outlives noderun like the containers do.
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWPID, Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the pod's pause process: %w", err)
	}
	go func() { _ = cmd.Wait() }() // reaped here while noderun lives
	pid := cmd.Process.Pid
	if err := pinNS(fmt.Sprintf("/proc/%d/ns/pid", pid), sb.PIDNSPath()); err != nil {
		_ = cmd.Process.Kill()
		return err
	}
	return os.WriteFile(filepath.Join(sb.Dir, pausePIDFile), []byte(strconv.Itoa(pid)), 0o600)
}

// pausePID is the pid of the pod's live pause process, or 0: the recorded
// process must still be in the pinned namespace.
func pausePID(sb *runner.Sandbox) int {
	b, err := os.ReadFile(filepath.Join(sb.Dir, pausePIDFile))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	var pinned, live unix.Stat_t
	if unix.Stat(sb.PIDNSPath(), &pinned) != nil || unix.Stat(fmt.Sprintf("/proc/%d/ns/pid", pid), &live) != nil {
		return 0
	}
	if pinned.Ino != live.Ino || pinned.Dev != live.Dev || !isNamespace(sb.PIDNSPath()) {
		return 0
	}
	return pid
}

// stopPause kills the pod's pause process (and with it everything left in
// its namespace) and removes its files; idempotent.
func stopPause(sb *runner.Sandbox) error {
	if pid := pausePID(sb); pid > 0 {
		if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("kill the pod's pause process %d: %w", pid, err)
		}
	}
	var errs []error
	// Most pods never had the file; only an existing one can be a mount
	// point, and reading the mount table for each pod's teardown costs
	// O(mounts) each, quadratic in a burst.
	_, err := os.Lstat(sb.PIDNSPath())
	for err == nil && (isNamespace(sb.PIDNSPath()) || mountedFile(sb.PIDNSPath())) {
		if err := unix.Unmount(sb.PIDNSPath(), unix.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Errorf("unmount %s: %w", sb.PIDNSPath(), err))
			break
		}
	}
	for _, p := range []string{sb.PIDNSPath(), filepath.Join(sb.Dir, pausePIDFile), filepath.Join(sb.Dir, pauseRootDir)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// pinNS bind-mounts a namespace file on target, as the other namespaces are
// pinned.
func pinNS(src, target string) error {
	if err := os.WriteFile(target, nil, 0o444); err != nil {
		return err
	}
	if err := unix.Mount(src, target, "none", unix.MS_BIND, ""); err != nil {
		return errors.Join(fmt.Errorf("bind %s to %s: %w", src, target, err), os.Remove(target))
	}
	return nil
}

// mountedFile reports whether something is still mounted on path (a pin
// whose namespace is gone no longer shows as nsfs).
func mountedFile(path string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	return err == nil && strings.Contains(string(b), " "+path+" ")
}
