package layout

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
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
