package cni

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// A Holder keeps pods' ipc and uts namespaces pinned inside a mount namespace
// of noderun's own rather than on the host. Each pin on the host is a line of
// the host's mount table, which the kernel formats for every reader of
// /proc/self/mountinfo, and runc reads it several times per container start:
// over a 100-pod start the two extra lines a pod cost about a tenth of the
// floor's time in make bench. The mount namespace itself is pinned by
// one host file, so it outlives noderun's restarts as the pause container
// outlives the kubelet's. noderun reaches into it through a thread of its own
// that has entered it: the host sees the holder's tree at
// /proc/<pid>/task/<tid>/root, which is the path runc is given.
//
// A pod's network namespace stays pinned on the host: CNI plugins, libcni's
// cache and nsenter name it by a path that must outlive noderun's process.
type Holder struct {
	mnt  *os.File      // the holder's mount namespace
	root string        // its pods directory as the host sees it
	done chan struct{} // ends the portal thread
	once sync.Once
}

const (
	holderPin  = "mnt"  // file in the holder's host dir pinning its mount namespace
	holderPods = "pods" // directory in the holder's tree: one subdirectory a pod
)

// OpenHolder opens the holder pinned in dir or, when there is none (first
// start, or the run dir was emptied by a reboot), makes one.
func OpenHolder(dir string) (*Holder, error) {
	h, err := openHolder(dir)
	if err != nil {
		return nil, fmt.Errorf("cni: namespace holder in %s: %w", dir, err)
	}
	return h, nil
}

func openHolder(dir string) (*Holder, error) {
	file := filepath.Join(dir, holderPin)
	live, err := IsNamespace(file)
	if err != nil {
		return nil, err
	}
	if !live {
		if err := makeHolder(dir, file); err != nil {
			return nil, err
		}
	}
	mnt, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	h := &Holder{mnt: mnt, done: make(chan struct{})}
	entered := make(chan error, 1)
	go onDiscardedThread(func() {
		err := h.enter()
		if err == nil {
			h.root = fmt.Sprintf("/proc/%d/task/%d/root/%s", os.Getpid(), unix.Gettid(), holderPods)
		}
		entered <- err
		if err == nil {
			<-h.done
		}
	})
	if err := <-entered; err != nil {
		return nil, errors.Join(err, mnt.Close())
	}
	return h, nil
}

// makeHolder makes the mount namespace and pins it at file.
func makeHolder(dir, file string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	// A mount namespace can be pinned only where the mount would propagate
	// to no other namespace (the kernel refuses to copy such a pin), so dir
	// becomes a private mount of its own.
	mounted, err := mountinfo.Mounted(dir)
	if err != nil {
		return err
	}
	if !mounted {
		if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s: %w", dir, err)
		}
	}
	if err := unix.Mount("", dir, "", unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make %s private: %w", dir, err)
	}
	err = makePinned(dir, file, -1)
	// The kernel refuses to pin a mount namespace whose number is not above
	// that of the namespace pinning it (its loop check), and Linux 6.18
	// numbers namespaces from per-CPU batches: inside a mount namespace of
	// its own (unshare --mount, as make test-controlplane runs), a holder
	// made on another CPU than that namespace was can be refused. One made
	// on that CPU never is, so each CPU is tried.
	var cpus unix.CPUSet
	if errors.Is(err, unix.EINVAL) && unix.SchedGetaffinity(0, &cpus) == nil {
		for cpu := 0; cpu < len(cpus)*64 && err != nil; cpu++ {
			if cpus.IsSet(cpu) {
				err = makePinned(dir, file, cpu)
			}
		}
	}
	return err
}

// makePinned makes the mount namespace on a thread bound to cpu (any,
// if negative) and pins it at file.
func makePinned(dir, file string, cpu int) error {
	made := make(chan error, 1)
	pinned := make(chan struct{})
	var tid int
	go onDiscardedThread(func() {
		var err error
		if cpu >= 0 {
			var set unix.CPUSet
			set.Set(cpu)
			err = unix.SchedSetaffinity(0, &set)
		}
		if err == nil {
			err = newMountNamespace(dir)
		}
		tid = unix.Gettid()
		made <- err
		<-pinned // the thread keeps the namespace alive until then
	})
	defer close(pinned)
	if err := <-made; err != nil {
		return err
	}
	return pin(fmt.Sprintf("/proc/%d/task/%d/ns/mnt", os.Getpid(), tid), file)
}

// newMountNamespace moves the calling thread, which must be a discarded one
// (onDiscardedThread), into a new mount namespace that holds nothing of the host's: its
// root is a tmpfs with the host's /proc (to name namespaces by) and the pods
// directory.
func newMountNamespace(dir string) error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("unshare: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
	if err := unix.Mount("noderun-ns", dir, "tmpfs", flags, "mode=0700"); err != nil {
		return fmt.Errorf("mount tmpfs on %s: %w", dir, err)
	}
	for _, d := range []string{"proc", holderPods} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			return err
		}
	}
	if err := unix.Mount("proc", filepath.Join(dir, "proc"), "proc", flags, ""); err != nil {
		return fmt.Errorf("mount proc: %w", err)
	}
	// The usual way to leave the old root: pivot onto the new one, old root
	// on top of it, then detach the old root (and every host mount copied
	// with it).
	if err := unix.Chdir(dir); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the old root: %w", err)
	}
	return unix.Chdir("/")
}

// enter moves the calling thread, which must be a discarded one
// (onDiscardedThread), into the holder's mount namespace.
func (h *Holder) enter() error {
	// setns into a mount namespace needs a filesystem context of its own.
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("unshare: %w", err)
	}
	if err := unix.Setns(int(h.mnt.Fd()), unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("enter the holder: %w", err)
	}
	return nil
}

// Root is the directory, as the host sees it while the holder is open, that
// holds one directory of namespace files per pod: <Root>/<id>/ipc and uts.
func (h *Holder) Root() string { return h.root }

// path is the host's path of a pod's namespace file in the holder.
func (h *Holder) path(id, kind string) string { return filepath.Join(h.root, id, kind) }

// IDs lists the pods that have a directory in the holder.
func (h *Holder) IDs() ([]string, error) {
	ents, err := os.ReadDir(h.root)
	if err != nil {
		return nil, fmt.Errorf("cni: namespace holder: %w", err)
	}
	ids := make([]string, 0, len(ents))
	for _, e := range ents {
		ids = append(ids, e.Name())
	}
	return ids, nil
}

// Close ends noderun's way into the holder; the namespaces stay pinned.
func (h *Holder) Close() error {
	var err error
	h.once.Do(func() {
		close(h.done)
		err = h.mnt.Close()
	})
	return err
}

// inside runs f on a thread in the holder's mount namespace and discards
// the thread.
func (h *Holder) inside(f func() error) error {
	var err error
	onDiscardedThread(func() {
		if err = h.enter(); err == nil {
			err = f()
		}
	})
	return err
}

// pinHere pins the calling thread's namespaces of kinds in the pod's
// directory of the holder. The thread must be a discarded one: it enters the
// holder's mount namespace.
func (h *Holder) pinHere(id string, kinds []string) (retErr error) {
	if err := h.enter(); err != nil {
		return err
	}
	dir := filepath.Join("/", holderPods, id)
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	for _, k := range kinds {
		target := filepath.Join(dir, k)
		if err := pin("/proc/thread-self/ns/"+k, target); err != nil {
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

// moveIn pins the namespaces pinned on the host at files (by kind) in the
// pod's directory of the holder, for sandboxes an older noderun made with
// every pin on the host; the caller then unpins the host's.
func (h *Holder) moveIn(id string, files map[string]string) error {
	fds := map[string]*os.File{}
	defer func() {
		for _, f := range fds {
			f.Close()
		}
	}()
	for k, file := range files {
		f, err := os.Open(file)
		if err != nil {
			return err
		}
		fds[k] = f
	}
	return h.inside(func() error {
		dir := filepath.Join("/", holderPods, id)
		if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
		for k, f := range fds {
			if err := pin(fmt.Sprintf("/proc/thread-self/fd/%d", f.Fd()), filepath.Join(dir, k)); err != nil {
				return err
			}
		}
		return nil
	})
}

// remove unpins the pod's namespaces in the holder and removes its directory.
func (h *Holder) remove(id string) error {
	return h.inside(func() error {
		dir := filepath.Join("/", holderPods, id)
		errs := []error{unpin(filepath.Join(dir, nsIPC)), unpin(filepath.Join(dir, nsUTS))}
		if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	})
}
