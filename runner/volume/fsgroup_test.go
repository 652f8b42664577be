package volume

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/internal/testenv"
)

// A container may leave FIFOs and device nodes in its volume (CAP_MKNOD is
// a default capability). The fsGroup walk gives them the group and mode,
// as the kubelet's does, without ever opening them: opening a device runs
// its driver (a watchdog arms, a serial line resets its board), outside
// any device cgroup.
func TestApplyFSGroupNeverOpensEntries(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mknod and chown")
	}
	testenv.SkipIfEmulated(t, "qemu-user shows the host's system call numbers in /proc/self/task/TID/syscall")
	vol := t.TempDir()
	sub, fifo := filepath.Join(vol, "sub"), filepath.Join(vol, "fifo")
	dev := filepath.Join(sub, "null")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(dev, unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	writer := blockedFIFOWriter(t, fifo)
	opens := watchOpens(t, sub, "null")

	gid := int64(4545)
	if err := ApplyFSGroup(vol, &v1.PodSecurityContext{FSGroup: &gid}); err != nil {
		t.Fatal(err)
	}
	if writer.released() {
		t.Error("the walk opened the planted FIFO (it released a writer blocked opening it)")
	}
	if opens != nil && opens() {
		t.Error("the walk opened the planted device node")
	}
	for path, want := range map[string]uint32{vol: 0o2775, sub: 0o2775, fifo: 0o660, dev: 0o660} {
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			t.Fatal(err)
		}
		if st.Gid != uint32(gid) || st.Mode&0o7777 != want {
			t.Errorf("%s: gid %d mode %o, want %d %o", path, st.Gid, st.Mode&0o7777, gid, want)
		}
	}
}

// fifoWriter is a thread blocked opening a FIFO for writing: any open of it
// for reading releases it.
type fifoWriter struct {
	tid  int
	done chan error
}

// blockedFIFOWriter starts a writer and returns once it sleeps in open(2).
func blockedFIFOWriter(t *testing.T, fifo string) *fifoWriter {
	if _, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/syscall", unix.Gettid())); err != nil {
		t.Skipf("cannot see a thread's system call: %v", err)
	}
	w := &fifoWriter{done: make(chan error, 1)}
	tids := make(chan int)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the writer
		tids <- unix.Gettid()
		fd, err := unix.Open(fifo, unix.O_WRONLY|unix.O_CLOEXEC, 0)
		if err == nil {
			unix.Close(fd)
		}
		w.done <- err
	}()
	w.tid = <-tids
	t.Cleanup(func() { // release it, whatever the test found
		if fd, err := unix.Open(fifo, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0); err == nil {
			unix.Close(fd)
		}
		<-w.done
	})
	deadline := time.After(time.Minute) // long past any scheduling delay
	for !w.sleepsInOpen() {
		select {
		case err := <-w.done:
			t.Fatalf("the writer's open of the FIFO returned without a reader: %v", err)
		case <-deadline:
			t.Skipf("the writer thread never shows as sleeping in openat (%d) in /proc/self/task/%d/syscall", unix.SYS_OPENAT, w.tid)
		case <-time.After(10 * time.Millisecond):
		}
	}
	return w
}

// sleepsInOpen reads the thread's current system call: a sleeping thread
// shows its number, a woken one "running" until it sleeps again.
func (w *fifoWriter) sleepsInOpen() bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/syscall", w.tid))
	f := strings.Fields(string(b))
	return err == nil && len(f) > 0 && f[0] == strconv.Itoa(unix.SYS_OPENAT)
}

// released reports whether something opened the FIFO since the writer
// slept: an open for reading wakes it at once and its open returns. A
// writer woken by anything else (a signal) goes back to sleep in open.
func (w *fifoWriter) released() bool {
	for {
		select {
		case <-w.done:
			w.done <- nil // for the cleanup
			return true
		default:
		}
		if w.sleepsInOpen() {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// watchOpens watches dir for opens of its entry name and returns what
// reports whether one happened since, or nil (with a log) where this
// kernel reports O_PATH opens too (before 6.5), which the walk makes.
func watchOpens(t *testing.T, dir, name string) func() bool {
	in, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(in) })
	if _, err := unix.InotifyAddWatch(in, dir, unix.IN_OPEN); err != nil {
		t.Fatal(err)
	}
	opened := func() bool {
		found := false
		buf := make([]byte, 4096)
		for {
			n, err := unix.Read(in, buf)
			if err == unix.EAGAIN {
				return found
			}
			if err != nil {
				t.Fatal(err)
			}
			for off := 0; off+unix.SizeofInotifyEvent <= n; {
				ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
				start := off + unix.SizeofInotifyEvent
				found = found || unix.ByteSliceToString(buf[start:start+int(ev.Len)]) == name
				off = start + int(ev.Len)
			}
		}
	}
	fd, err := unix.Open(filepath.Join(dir, name), unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	if opened() {
		t.Log("this kernel reports O_PATH opens to inotify: the device node's opens are not told apart")
		return nil
	}
	return opened
}
