// Package cni gives a pod its network: namespaces pinned to files (there is no
// pause container to hold them) and a CNI attachment made through libcni.
package cni

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"

	"golang.org/x/sys/unix"
)

// Namespaces holds the paths of a pod's pinned namespace files. A path is
// empty when the pod shares that namespace with the host.
type Namespaces struct{ Net, IPC, UTS string }

// Names of the pinned files; each matches its entry under /proc/<pid>/ns.
const (
	nsNet = "net"
	nsIPC = "ipc"
	nsUTS = "uts"
)

var cloneFlags = map[string]int{
	nsNet: unix.CLONE_NEWNET,
	nsIPC: unix.CLONE_NEWIPC,
	nsUTS: unix.CLONE_NEWUTS,
}

// CreateNamespaces creates the pod's namespaces and pins each onto a file in
// dir: net, ipc and uts, or only ipc for a hostNetwork pod, which shares the
// host's network and hostname as in Kubernetes. A new UTS namespace gets
// hostname (if not empty) and a new network namespace gets "lo" up.
//
// Namespaces already pinned in dir are kept, so a repeat after a crash
// creates only what is missing and never replaces a namespace a CNI
// attachment or container may already use.
func CreateNamespaces(dir, hostname string, hostNetwork bool) (Namespaces, error) {
	kinds := []string{nsIPC}
	nss := Namespaces{IPC: filepath.Join(dir, nsIPC)}
	if !hostNetwork {
		kinds = []string{nsNet, nsIPC, nsUTS}
		nss.Net = filepath.Join(dir, nsNet)
		nss.UTS = filepath.Join(dir, nsUTS)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Namespaces{}, fmt.Errorf("cni: create namespaces in %s: %w", dir, err)
	}
	var missing []string
	for _, k := range kinds {
		pinned, err := isNamespace(filepath.Join(dir, k))
		if err != nil {
			return Namespaces{}, fmt.Errorf("cni: create namespaces in %s: %w", dir, err)
		}
		if !pinned {
			missing = append(missing, k)
		}
	}
	if len(missing) == 0 {
		return nss, nil
	}

	errc := make(chan error, 1)
	go func() {
		// The thread leaves the host's namespaces below. It is never
		// unlocked, so the runtime ends it with this goroutine instead of
		// running other goroutines inside the pod's namespaces.
		runtime.LockOSThread()
		errc <- unshareAndPin(dir, hostname, missing)
	}()
	if err := <-errc; err != nil {
		return Namespaces{}, fmt.Errorf("cni: create namespaces in %s: %w", dir, err)
	}
	return nss, nil
}

// unshareAndPin must run on a locked thread that is discarded afterwards.
func unshareAndPin(dir, hostname string, kinds []string) (retErr error) {
	flags := 0
	for _, k := range kinds {
		flags |= cloneFlags[k]
	}
	if err := unix.Unshare(flags); err != nil {
		return fmt.Errorf("unshare: %w", err)
	}
	if slices.Contains(kinds, nsUTS) && hostname != "" {
		if err := unix.Sethostname([]byte(hostname)); err != nil {
			return fmt.Errorf("set hostname %q: %w", hostname, err)
		}
	}
	if slices.Contains(kinds, nsNet) {
		if err := loopbackUp(); err != nil {
			return err
		}
	}
	tid := unix.Gettid()
	for _, k := range kinds {
		target := filepath.Join(dir, k)
		src := fmt.Sprintf("/proc/%d/task/%d/ns/%s", os.Getpid(), tid, k)
		if err := pin(src, target); err != nil {
			return err
		}
		defer func() {
			if retErr != nil {
				retErr = errors.Join(retErr, unpin(target))
			}
		}()
	}
	return nil
}

// pin bind-mounts the namespace file src onto target, keeping the namespace
// alive after its last process (here: the discarded thread) is gone.
func pin(src, target string) error {
	f, err := os.OpenFile(target, os.O_RDONLY|os.O_CREATE, 0o444)
	if err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return errors.Join(err, os.Remove(target))
	}
	if err := unix.Mount(src, target, "none", unix.MS_BIND, ""); err != nil {
		return errors.Join(fmt.Errorf("bind %s to %s: %w", src, target, err), os.Remove(target))
	}
	return nil
}

// unpin undoes pin; a missing file or mount is success.
func unpin(target string) error {
	// Loop because a racing or repeated pin may have stacked mounts.
	for {
		err := unix.Unmount(target, unix.MNT_DETACH)
		if err == nil {
			continue
		}
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			break // not (or no longer) a mount point
		}
		return fmt.Errorf("unmount %s: %w", target, err)
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// isNamespace reports whether path is a live namespace file (nsfs), either
// pinned by a bind mount or under /proc. A leftover plain file after a
// reboot or a failed pin is not.
func isNamespace(path string) (bool, error) {
	var st unix.Statfs_t
	err := unix.Statfs(path, &st)
	switch {
	case errors.Is(err, unix.ENOENT):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("statfs %s: %w", path, err)
	}
	return st.Type == unix.NSFS_MAGIC, nil
}

// loopbackUp sets "lo" up in the calling thread's network namespace, since a
// pod's own conflist need not include the loopback plugin.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("set lo up: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return fmt.Errorf("set lo up: %w", err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("set lo up: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("set lo up: %w", err)
	}
	return nil
}

// RemoveNamespaces unpins the namespace files in dir and removes them and
// dir; whatever is already gone counts as removed. dir is kept if something
// else still lives in it, because that belongs to another owner.
func RemoveNamespaces(dir string) error {
	var errs []error
	for _, k := range []string{nsNet, nsIPC, nsUTS} {
		errs = append(errs, unpin(filepath.Join(dir, k)))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cni: remove namespaces in %s: %w", dir, err)
	}
	err := os.Remove(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, unix.ENOTEMPTY) {
		return fmt.Errorf("cni: remove namespaces in %s: %w", dir, err)
	}
	return nil
}
