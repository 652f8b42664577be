package containerd

import (
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"slices"

	"golang.org/x/sys/unix"
)

// runcRecursiveReadOnly tells whether recursive read-only mounts can be
// made, as containerd's CRI tells the kubelet (its runtime handler's
// recursive_read_only_mounts feature): the runc on PATH lists the "rro"
// mount option in `runc features` (runc 1.1 and later) and the kernel has
// mount_setattr (Linux 5.12), which runc sets MOUNT_ATTR_RDONLY with,
// recursively. Probed rather than read from a version: a backported kernel
// has it earlier.
func runcRecursiveReadOnly(ctx context.Context) bool {
	out, err := exec.CommandContext(ctx, "runc", "features").Output()
	if err != nil {
		return false
	}
	var f struct {
		MountOptions []string `json:"mountOptions"`
	}
	if json.Unmarshal(out, &f) != nil || !slices.Contains(f.MountOptions, "rro") {
		return false
	}
	// A bad descriptor gets EBADF where the call exists, ENOSYS where not.
	err = unix.MountSetattr(-1, "", 0, &unix.MountAttr{})
	return !errors.Is(err, unix.ENOSYS)
}

// RecursiveReadOnlyMounts says whether containers can have recursive
// read-only mounts (volumeMounts' recursiveReadOnly).
func (r *Runtime) RecursiveReadOnlyMounts() bool { return r.rro }
