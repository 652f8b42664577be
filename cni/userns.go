package cni

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// IDMap maps a pod's user namespace IDs 0..Size-1 onto the host's
// HostID..HostID+Size-1, for both UIDs and GIDs (the kubelet gives a pod
// one range for both).
type IDMap struct{ HostID, Size uint32 }

const nsUser = "user"

// UserNSPath is the pinned user namespace of a pod made by
// CreateNamespacesInUserNS in dir.
func UserNSPath(dir string) string { return filepath.Join(dir, nsUser) }

// CreateNamespacesInUserNS is CreateNamespaces for a pod with a user
// namespace of its own (hostUsers: false): a new user namespace with the
// mapping m, and net, ipc and uts namespaces owned by it, as containerd's
// CRI makes a user-namespaced sandbox. Owned by it, they let the pod's root
// do there what root in a pod does (bind a low port, mount sysfs and
// mqueue, set its hostname). The user namespace is pinned in dir beside
// the net pin.
//
// A process can create or enter a user namespace only while it has one
// thread, so a child process makes them all in one clone; it is stopped
// before it runs anything (see stoppedChild) and killed once they are
// pinned. Kept as CreateNamespaces keeps them when all are there; when only
// some are (someone unpinned one), those that are left cannot own new
// ones, so all are made anew.
func CreateNamespacesInUserNS(dir, hostname string, m IDMap, h *Holder) (Namespaces, error) {
	nss, err := createInUserNS(dir, hostname, m, h)
	if err != nil {
		return Namespaces{}, fmt.Errorf("cni: create namespaces in %s: %w", dir, err)
	}
	return nss, nil
}

func createInUserNS(dir, hostname string, m IDMap, h *Holder) (Namespaces, error) {
	path := func(k string) string { return pinPath(dir, h, k) }
	nss := Namespaces{User: path(nsUser), Net: path(nsNet), IPC: path(nsIPC), UTS: path(nsUTS)}
	kinds := []string{nsUser, nsNet, nsIPC, nsUTS}
	pinned := 0
	for _, k := range kinds {
		ok, err := IsNamespace(path(k))
		if err != nil {
			return Namespaces{}, err
		}
		if ok {
			pinned++
		}
	}
	if pinned == len(kinds) {
		return nss, nil
	}
	if pinned > 0 {
		if err := removeNamespaces(dir, h); err != nil {
			return Namespaces{}, err
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Namespaces{}, err
	}
	// The child's tracer, and the parent its death signal follows, is
	// this thread: it must not change or end until the child is reaped.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	child, err := stoppedChild(m)
	if err != nil {
		return Namespaces{}, err
	}
	defer child.end()
	proc := fmt.Sprintf("/proc/%d/ns/", child.pid)
	if err := pin(proc+nsUser, path(nsUser)); err != nil {
		return Namespaces{}, err
	}
	var onHost []string
	onDiscardedThread(func() { onHost, err = enterAndPin(dir, hostname, proc, kinds[1:], h) })
	if err != nil {
		for _, target := range append(onHost, path(nsUser)) {
			err = errors.Join(err, unpin(target))
		}
		return Namespaces{}, err
	}
	return nss, nil
}

// enterAndPin moves the calling thread, a discarded one, into the
// namespaces of kinds under proc (a process's ns directory), then does
// what unshareAndPin does after its unshare. Root on the host may enter
// them: it has every capability in the user namespaces below its own.
func enterAndPin(dir, hostname, proc string, kinds []string, h *Holder) ([]string, error) {
	if err := unix.Unshare(unix.CLONE_FS); err != nil { // setns needs it for ipc and uts
		return nil, fmt.Errorf("unshare: %w", err)
	}
	for _, k := range kinds {
		f, err := os.Open(proc + k)
		if err != nil {
			return nil, err
		}
		err = unix.Setns(int(f.Fd()), cloneFlags[k])
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("enter the new %s namespace: %w", k, err)
		}
	}
	return configureAndPin(dir, hostname, kinds, h)
}

// A child is a process stopped before it ran anything, in namespaces
// made for it.
type child struct{ pid int }

// stoppedChild starts a process in a new user namespace with the mapping
// m and new net, ipc and uts namespaces, all of which that user namespace
// owns. The process is this program traced (PTRACE_TRACEME), so it stops
// at its exec and never runs: runc makes the user namespaces of idmapped
// mounts the same way, and it needs no helper program.
func stoppedChild(m IDMap) (*child, error) {
	ids := []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(m.HostID), Size: int(m.Size)}}
	p, err := os.StartProcess("/proc/self/exe", []string{"noderun-userns"}, &os.ProcAttr{
		Sys: &syscall.SysProcAttr{
			Cloneflags:  unix.CLONE_NEWUSER | unix.CLONE_NEWNET | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS,
			UidMappings: ids, GidMappings: ids,
			Ptrace:    true,
			Pdeathsig: syscall.SIGKILL,
		},
	})
	if err != nil {
		return nil, fmt.Errorf("start a process in a new user namespace: %w", err)
	}
	c := &child{pid: p.Pid}
	var ws unix.WaitStatus
	if _, err := unix.Wait4(c.pid, &ws, unix.WALL, nil); err != nil || !ws.Stopped() {
		c.end()
		return nil, fmt.Errorf("the user namespace process did not stop at its exec (status %v): %v", ws, err)
	}
	return c, nil
}

// end kills the child and reaps it.
func (c *child) end() {
	_ = unix.Kill(c.pid, unix.SIGKILL)
	var ws unix.WaitStatus
	for {
		if _, err := unix.Wait4(c.pid, &ws, unix.WALL, nil); !errors.Is(err, unix.EINTR) {
			return
		}
	}
}
