package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/noderun/noderun/runner"
)

// shmSize is the size CRI gives a pod's /dev/shm (containerd's default
// sandbox shm of 64 MiB).
const shmSize = "65536k"

// setupShm mounts the pod's /dev/shm tmpfs once; it lives in the run dir,
// so a reboot starts it empty, as a new pause container would.
func setupShm(sb *runner.Sandbox) error {
	dir := sb.ShmPath()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if mounted(dir) {
		return nil
	}
	err := unix.Mount("shm", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=1777,size="+shmSize)
	if err != nil {
		return fmt.Errorf("mount the pod's /dev/shm: %w", err)
	}
	return nil
}

// unmountShm removes the pod's /dev/shm; idempotent.
func unmountShm(sb *runner.Sandbox) error {
	dir := sb.ShmPath()
	if mounted(dir) {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmount %s: %w", dir, err)
		}
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// mounted reports whether dir is on another file system than its parent,
// which holds for the shm tmpfs.
func mounted(dir string) bool {
	var st, parent unix.Stat_t
	return unix.Stat(dir, &st) == nil && unix.Stat(filepath.Dir(dir), &parent) == nil && st.Dev != parent.Dev
}
