package layout

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestLockDirs(t *testing.T) {
	state, run := t.TempDir(), t.TempDir()
	release, err := lockDirs(state, run)
	if err != nil {
		t.Fatal(err)
	}
	pid := strconv.Itoa(os.Getpid())
	for _, dir := range []string{state, run} {
		b, err := os.ReadFile(filepath.Join(dir, "lock"))
		if err != nil || strings.TrimSpace(string(b)) != pid {
			t.Errorf("%s/lock = %q, %v; want our pid %s", dir, b, err, pid)
		}
	}
	// flock is per open file, so a second open in this process is refused
	// as a second noderun would be; each directory alone is enough.
	for _, dirs := range [][]string{{state, run}, {run}, {t.TempDir(), run}} {
		if _, err := lockDirs(dirs...); !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "pid "+pid) {
			t.Errorf("lockDirs(%v) while held: %v; want ErrLocked naming pid %s", dirs, err, pid)
		}
	}
	release()
	release, err = lockDirs(state, run)
	if err != nil {
		t.Fatalf("after release: %v", err)
	}
	release()
	// --state-dir and --run-dir may be one directory.
	release, err = lockDirs(state, state)
	if err != nil {
		t.Fatalf("one dir twice: %v", err)
	}
	release()
}

// A lock whose holder has exited while a descriptor of it lives on (a
// child it was starting, before its exec) is waited for; a live holder's
// is refused at once.
func TestLockDeadHolder(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "lock")
	other, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := unix.Flock(int(other.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	// A PID that ran and has been reaped.
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(strconv.Itoa(dead.Process.Pid)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	released := make(chan struct{})
	go func() {
		defer close(released)
		time.Sleep(200 * time.Millisecond)
		other.Close()
	}()
	release, err := lockDirs(dir)
	if err != nil {
		t.Fatalf("lock of a dead holder, released a moment later: %v", err)
	}
	<-released
	release()

	// A live holder: refused without waiting out deadHolderWait.
	other, err = os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := unix.Flock(int(other.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if _, err := lockDirs(dir); !errors.Is(err, ErrLocked) {
		t.Fatalf("lock held by a live process: %v, want ErrLocked", err)
	}
	if waited := time.Since(began); waited >= deadHolderWait {
		t.Errorf("waited %s for a live holder", waited)
	}
}
