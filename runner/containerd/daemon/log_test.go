package daemon

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// A writer holding the log open with O_APPEND, as the managed containerd's
// stderr is, keeps writing whole lines at the start of the emptied file, and
// the files stay bounded however much it writes.
func TestBoundLogWithAppendingWriter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "containerd.log")
	w, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	const bound, line, lines = 4 << 10, 64, 5000
	// The writer and the checks take turns, a batch of lines between two
	// checks, so the bound is exact whatever the machine's load.
	const batch = 10
	rotations, biggest := 0, int64(0)
	for i := 0; i < lines; i += batch {
		for j := i; j < i+batch; j++ {
			if _, err := fmt.Fprintf(w, "%0*d\n", line-1, j); err != nil {
				t.Fatal(err)
			}
		}
		if st, err := os.Stat(path); err == nil {
			biggest = max(biggest, st.Size())
		}
		rotated, err := boundLog(path, bound)
		if err != nil {
			t.Fatal(err)
		}
		if rotated {
			rotations++
		}
	}
	if rotations == 0 {
		t.Fatalf("%d bytes written, never rotated", line*lines)
	}
	if biggest > bound+batch*line {
		t.Errorf("log reached %d bytes with a bound of %d", biggest, bound)
	}
	for _, p := range []string{path, path + ".1"} {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.IndexByte(b, 0) >= 0 || len(b)%line != 0 {
			t.Errorf("%s: %d bytes, holes or cut lines: the writer did not follow the truncation", p, len(b))
		}
	}
	if _, err := os.Stat(path + ".1.tmp"); !os.IsNotExist(err) {
		t.Errorf("temporary copy left: %v", err)
	}
}

func TestBoundLogLeavesSmallOrMissingLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "containerd.log")
	if rotated, err := boundLog(path, 10); rotated || err != nil {
		t.Fatalf("missing log: rotated %v, %v", rotated, err)
	}
	if err := os.WriteFile(path, []byte("short\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	if rotated, err := boundLog(path, 10); rotated || err != nil {
		t.Fatalf("small log: rotated %v, %v", rotated, err)
	}
	if b, _ := os.ReadFile(path); string(b) != "short\n" {
		t.Errorf("small log changed to %q", b)
	}
}

// The log of a real managed containerd stays bounded while Supervise runs,
// including across a restart of the daemon (which logs its whole start).
func TestSuperviseBoundsManagedLog(t *testing.T) {
	m, e := daemonLogMax, daemonLogEvery
	t.Cleanup(func() { daemonLogMax, daemonLogEvery = m, e }) // after the supervisor stopped
	daemonLogMax, daemonLogEvery = 2<<10, 100*time.Millisecond
	cfg, conn := connectManaged(t)
	logPath := cfg.managedLog()
	if st, err := os.Stat(logPath); err != nil || st.Size() < daemonLogMax {
		t.Fatalf("containerd's start should log more than %d bytes: %v %v", daemonLogMax, st, err)
	}
	superviseUntilEnd(t, conn)
	// rotatedSince waits for a rotation written after since and for the
	// log to be small again. The copy's modification time tells the
	// rotation: ext4 may give a later copy an earlier copy's inode number.
	rotatedSince := func(what string, since time.Time) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			st, err := os.Stat(logPath)
			prev, perr := os.Stat(logPath + ".1")
			if err == nil && st.Size() < daemonLogMax && perr == nil && prev.ModTime().After(since) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: log not rotated within 20s (%v, %v; previous %v, %v)", what, st, err, prev, perr)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	rotatedSince("first start", time.Time{})
	killed := time.Now()
	if err := syscall.Kill(mustSocketPID(t, conn.Address), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	rotatedSince("after a restart", killed)
}
