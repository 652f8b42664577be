// Package volume holds noderun's hostile-path-safe file operations: the
// mechanics of emptyDir, hostPath, subPath, the API-data volumes
// (downwardAPI, configMap, secret, projected) and fsGroup, and the
// removal of noderun's directories, done so that no link or mount a
// container planted in a volume redirects them. It knows no pod worker:
// package runner decides which volumes a pod has and where they go.
package volume

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
)

// SetupEmptyDir makes the emptyDir at dir, world-writable as Kubernetes
// makes it, on a tmpfs of its own for medium Memory; repeating it is
// harmless.
func SetupEmptyDir(dir string, src *v1.EmptyDirVolumeSource) error {
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return err
	}
	if src.Medium == v1.StorageMediumMemory && !isMountPoint(dir) {
		opts := "mode=0777"
		if src.SizeLimit != nil && !src.SizeLimit.IsZero() {
			opts += ",size=" + strconv.FormatInt(src.SizeLimit.Value(), 10)
		}
		if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
			return err
		}
	}
	// Kubernetes makes emptyDirs world-writable so any container user can
	// use them. The directory is noderun's (its parents no container can
	// write), so the path is safe to use.
	return os.Chmod(dir, 0o777)
}

// SetupTmpfs makes dir a tmpfs of its own, for a volume whose content must
// not reach a disk (secret and projected volumes, as the kubelet mounts
// them); mount false (tests without root) leaves it a plain directory.
// Repeating it is harmless.
func SetupTmpfs(dir string, mount bool) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if !mount || isMountPoint(dir) {
		return nil
	}
	return unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755")
}

// SetupHostPath checks the hostPath's type, or creates it for the
// DirectoryOrCreate and FileOrCreate types.
func SetupHostPath(hp *v1.HostPathVolumeSource) error {
	t := v1.HostPathUnset
	if hp.Type != nil {
		t = *hp.Type
	}
	fi, err := os.Stat(hp.Path)
	switch t {
	case v1.HostPathUnset:
		return nil
	case v1.HostPathDirectoryOrCreate:
		if os.IsNotExist(err) {
			return os.MkdirAll(hp.Path, 0o755)
		}
	case v1.HostPathFileOrCreate:
		if os.IsNotExist(err) {
			if err := os.MkdirAll(filepath.Dir(hp.Path), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(hp.Path, os.O_CREATE|os.O_WRONLY, 0o644)
			if err != nil {
				return err
			}
			return f.Close()
		}
	}
	if err != nil {
		return fmt.Errorf("hostPath %s: %w", hp.Path, err)
	}
	want := map[v1.HostPathType]func(os.FileMode) bool{
		v1.HostPathDirectoryOrCreate: os.FileMode.IsDir,
		v1.HostPathDirectory:         os.FileMode.IsDir,
		v1.HostPathFileOrCreate:      os.FileMode.IsRegular,
		v1.HostPathFile:              os.FileMode.IsRegular,
		v1.HostPathSocket:            func(m os.FileMode) bool { return m&os.ModeSocket != 0 },
		v1.HostPathCharDev:           func(m os.FileMode) bool { return m&os.ModeCharDevice != 0 },
		v1.HostPathBlockDev:          func(m os.FileMode) bool { return m&os.ModeDevice != 0 && m&os.ModeCharDevice == 0 },
	}[t]
	if want != nil && !want(fi.Mode()) {
		return fmt.Errorf("hostPath %s is not of type %s", hp.Path, t)
	}
	return nil
}

// PinSubPath resolves subPath inside the volume at root, refusing any
// resolution that leaves it, and binds the result on target.
func PinSubPath(root, subPath, target string) error {
	if filepath.IsAbs(subPath) || hasDotDot(subPath) {
		return fmt.Errorf("must be a relative path inside the volume")
	}
	h, err := openSubPath(root, subPath)
	if err != nil {
		return err
	}
	defer h.Close()
	return bindSubPath(h, target)
}

func hasDotDot(p string) bool {
	return slices.Contains(strings.Split(p, "/"), "..")
}

// isMountPoint compares the device with the parent's, enough for tmpfs.
func isMountPoint(dir string) bool {
	var st, parent unix.Stat_t
	if unix.Stat(dir, &st) != nil || unix.Stat(filepath.Dir(dir), &parent) != nil {
		return false
	}
	return st.Dev != parent.Dev
}
