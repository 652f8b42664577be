package containerd

import (
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"slices"

	"golang.org/x/sys/unix"
)

// runcFeatures is what `runc features` (runc 1.1 and later) says that
// noderun asks about; containerd's CRI reads the same to tell the kubelet
// its runtime handler's features. Zero when runc cannot say.
type runcFeatures struct {
	MountOptions []string `json:"mountOptions"`
	Linux        struct {
		MountExtensions struct {
			IDMap struct {
				Enabled bool `json:"enabled"`
			} `json:"idmap"`
		} `json:"mountExtensions"`
	} `json:"linux"`
}

// readRuncFeatures runs the runc on PATH's `runc features`.
func readRuncFeatures(ctx context.Context) runcFeatures {
	var f runcFeatures
	if out, err := exec.CommandContext(ctx, "runc", "features").Output(); err == nil {
		_ = json.Unmarshal(out, &f) // unreadable is as none
	}
	return f
}

// recursiveReadOnly tells whether recursive read-only mounts can be made,
// as containerd's CRI tells the kubelet (its runtime handler's
// recursive_read_only_mounts feature): runc lists the "rro" mount option
// and the kernel has mount_setattr (Linux 5.12), which runc sets
// MOUNT_ATTR_RDONLY with, recursively. Probed rather than read from a
// version: a backported kernel has it earlier.
func (f runcFeatures) recursiveReadOnly() bool {
	if !slices.Contains(f.MountOptions, "rro") {
		return false
	}
	// A bad descriptor gets EBADF where the call exists, ENOSYS where not.
	err := unix.MountSetattr(-1, "", 0, &unix.MountAttr{})
	return !errors.Is(err, unix.ENOSYS)
}

// RecursiveReadOnlyMounts says whether containers can have recursive
// read-only mounts (volumeMounts' recursiveReadOnly).
func (r *Runtime) RecursiveReadOnlyMounts() bool { return r.rro }
