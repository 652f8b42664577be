package kubeapi

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestListenUnixNeverLooser creates the socket many times under umask 0
// while an inotify watcher stats every entry the moment it appears in the
// socket's directory: none may ever grant group or others any access.
func TestListenUnixNeverLooser(t *testing.T) {
	dir, err := os.MkdirTemp("/tmp", "nrl") // sun_path is short
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE|unix.IN_MOVED_TO); err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		loose []string
		wg    sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, 64<<10)
		for {
			n, err := unix.Read(fd, buf)
			if err != nil || n <= 0 {
				return
			}
			for off := 0; off+unix.SizeofInotifyEvent <= n; {
				nameLen := int(binary.NativeEndian.Uint32(buf[off+12:]))
				name := string(bytes.TrimRight(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+nameLen], "\x00"))
				off += unix.SizeofInotifyEvent + nameLen
				if name == "done" {
					return
				}
				var st unix.Stat_t
				if unix.Lstat(filepath.Join(dir, name), &st) == nil && st.Mode&0o077 != 0 {
					mu.Lock()
					loose = append(loose, name)
					mu.Unlock()
				}
			}
		}
	}()
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	path := filepath.Join(dir, "api.sock")
	for range 300 {
		l, err := ListenUnix(path)
		if err != nil {
			t.Fatal(err)
		}
		l.Close()
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v, want 0600", fi.Mode().Perm())
	}
	// The watcher stops at this entry: closing fd would not wake its read.
	if err := os.WriteFile(filepath.Join(dir, "done"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	unix.Close(fd)
	mu.Lock()
	defer mu.Unlock()
	if len(loose) > 0 {
		t.Fatalf("%d entries were reachable by others when they appeared, e.g. %q", len(loose), loose[0])
	}
}
