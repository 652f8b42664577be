// Package cni gives a pod its network: namespaces pinned to files (there is no
// pause container to hold them) and a CNI attachment made through libcni.
package cni

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"
)

// Namespaces holds the paths of a pod's pinned namespace files. A path is
// empty when the pod shares that namespace with the host.
type Namespaces struct{ User, Net, IPC, UTS string }

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

// CreateNamespaces creates the pod's namespaces and pins each onto a file:
// net, ipc and uts, or only ipc for a hostNetwork pod, which shares the
// host's network and hostname as in Kubernetes. The net pin is in dir; the
// ipc and uts pins are in h under dir's name, or in dir when h is nil. A new
// UTS namespace gets hostname (if not empty) and a new network namespace gets
// "lo" up.
//
// Namespaces already pinned are kept, so a repeat after a crash creates only
// what is missing and never replaces a namespace a CNI attachment or
// container may already use. ipc and uts pins an older noderun left in dir
// move into h.
func CreateNamespaces(dir, hostname string, hostNetwork bool, h *Holder) (Namespaces, error) {
	nss, err := createNamespaces(dir, hostname, hostNetwork, h)
	if err != nil {
		return Namespaces{}, fmt.Errorf("cni: create namespaces in %s: %w", dir, err)
	}
	return nss, nil
}

// pinPath is where the pod whose sandbox dir is dir has its namespace of
// kind k pinned: net and user in dir, the others in h (in dir without one).
func pinPath(dir string, h *Holder, k string) string {
	if h == nil || k == nsNet || k == nsUser {
		return filepath.Join(dir, k)
	}
	return h.path(filepath.Base(dir), k)
}

func createNamespaces(dir, hostname string, hostNetwork bool, h *Holder) (Namespaces, error) {
	id := filepath.Base(dir)
	path := func(k string) string { return pinPath(dir, h, k) }
	kinds := []string{nsIPC}
	nss := Namespaces{IPC: path(nsIPC)}
	if !hostNetwork {
		kinds = []string{nsNet, nsIPC, nsUTS}
		nss.Net, nss.UTS = path(nsNet), path(nsUTS)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Namespaces{}, err
	}
	var missing []string
	moving := map[string]string{}
	for _, k := range kinds {
		pinned, err := IsNamespace(path(k))
		if err != nil {
			return Namespaces{}, err
		}
		if pinned {
			continue
		}
		if old := filepath.Join(dir, k); old != path(k) {
			if pinned, err := IsNamespace(old); err != nil {
				return Namespaces{}, err
			} else if pinned {
				moving[k] = old
				continue
			}
		}
		missing = append(missing, k)
	}
	if len(moving) > 0 {
		if err := h.moveIn(id, moving); err != nil {
			return Namespaces{}, err
		}
		for _, old := range moving {
			if err := unpin(old); err != nil {
				return Namespaces{}, err
			}
		}
	}
	if len(missing) == 0 {
		return nss, nil
	}

	var onHost []string
	var err error
	onDiscardedThread(func() { onHost, err = unshareAndPin(dir, hostname, missing, h) })
	if err != nil {
		// Undone here: the thread that made them may have left the
		// host's mount namespace.
		for _, target := range onHost {
			err = errors.Join(err, unpin(target))
		}
		return Namespaces{}, err
	}
	return nss, nil
}

// unshareAndPin must run on a discarded thread (onDiscardedThread). It
// returns the pins it made on the host.
func unshareAndPin(dir, hostname string, kinds []string, h *Holder) (onHost []string, _ error) {
	flags := 0
	for _, k := range kinds {
		flags |= cloneFlags[k]
	}
	if err := unix.Unshare(flags); err != nil {
		return nil, fmt.Errorf("unshare: %w", err)
	}
	return configureAndPin(dir, hostname, kinds, h)
}

// configureAndPin sets the calling thread's new UTS namespace's hostname,
// brings its new network namespace's "lo" up and pins its namespaces of
// kinds; the thread must be a discarded one. It returns the pins it made
// on the host.
func configureAndPin(dir, hostname string, kinds []string, h *Holder) (onHost []string, _ error) {
	if slices.Contains(kinds, nsUTS) && hostname != "" {
		if err := unix.Sethostname([]byte(hostname)); err != nil {
			return nil, fmt.Errorf("set hostname %q: %w", hostname, err)
		}
	}
	if slices.Contains(kinds, nsNet) {
		if err := loopbackUp(); err != nil {
			return nil, err
		}
	}
	var held []string
	for _, k := range kinds {
		if h != nil && k != nsNet {
			held = append(held, k)
			continue
		}
		target := filepath.Join(dir, k)
		if err := pin("/proc/thread-self/ns/"+k, target); err != nil {
			return onHost, err
		}
		onHost = append(onHost, target)
	}
	if len(held) > 0 {
		return onHost, h.pinHere(filepath.Base(dir), held)
	}
	return onHost, nil
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

// IsNamespace reports whether path is a live namespace file (nsfs), either
// pinned by a bind mount or under /proc. A leftover plain file after a
// reboot or a failed pin is not.
func IsNamespace(path string) (bool, error) {
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

// RemoveNamespaces unpins the pod's namespace files, in dir and in h (nil:
// all in dir), and removes them and dir; whatever is already gone counts as
// removed. dir is kept if something else still lives in it, because that
// belongs to another owner.
func RemoveNamespaces(dir string, h *Holder) error {
	if err := removeNamespaces(dir, h); err != nil {
		return fmt.Errorf("cni: remove namespaces in %s: %w", dir, err)
	}
	err := os.Remove(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, unix.ENOTEMPTY) {
		return fmt.Errorf("cni: remove namespaces in %s: %w", dir, err)
	}
	return nil
}

// removeNamespaces unpins the pod's namespace files, keeping dir.
func removeNamespaces(dir string, h *Holder) error {
	var errs []error
	// The holder's first: while the net pin is there, a pod's namespaces
	// are not all released (the bench waits for it to go).
	if h != nil {
		errs = append(errs, h.remove(filepath.Base(dir)))
	}
	// The user namespace last: it owns the others.
	for _, k := range []string{nsNet, nsIPC, nsUTS, nsUser} {
		errs = append(errs, unpin(filepath.Join(dir, k)))
	}
	return errors.Join(errs...)
}
