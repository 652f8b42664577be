// Package memtrim gives a long-lived process's memory back once it goes
// quiet: the Go heap it freed and the pages of its own binary it touched.
package memtrim

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Trimmer gives memory back once noderun goes quiet: a burst of pod starts
// leaves freed heap and freshly touched binary pages behind, which an idle
// appliance should not keep. It waits on a timer, so it costs nothing while
// nothing happens.
type Trimmer struct{ poke chan struct{} }

const quietAfter = time.Second

// New returns a Trimmer; Run does the work.
func New() *Trimmer { return &Trimmer{poke: make(chan struct{}, 1)} }

// Activity notes that work happened; it never blocks.
func (t *Trimmer) Activity() {
	select {
	case t.poke <- struct{}{}:
	default:
	}
}

// Run trims once a quiet second follows activity (and a second after it
// starts), until ctx ends.
func (t *Trimmer) Run(ctx context.Context) {
	timer := time.NewTimer(quietAfter)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.poke:
			timer.Reset(quietAfter)
		case <-timer.C:
			debug.FreeOSMemory()
			TrimExecutable()
		}
	}
}

// TrimExecutable keeps noderun's own binary out of its resident memory
// beyond what it actually uses. On kernels that cache executables in large
// folios, every read-only mapping of the binary is mapped with 2 MiB pages,
// so touching one byte of a region makes all of it resident: most of a
// 30 MiB binary, in the daemon and in every log driver writing a log.
// Marking the mappings NOHUGEPAGE and dropping what is mapped now makes
// later faults map 4 KiB pages (plus the kernel's fault-around), so resident
// memory is the pages in use. Only read-only mappings are touched: dropping
// them loses nothing, they are read back from the page cache on demand.
func TrimExecutable() {
	exe, err := os.Executable()
	if err != nil {
		return
	}
	if resolved, err := filepath.EvalSymlinks(exe); err == nil {
		exe = resolved
	}
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return
	}
	defer f.Close()
	type vma struct{ start, end uint64 }
	var trim []vma
	var cur *vma
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		switch {
		case len(fields) >= 6 && strings.Contains(fields[0], "-"):
			// start-end perms offset dev inode path: a new mapping.
			cur = nil
			lo, hi, _ := strings.Cut(fields[0], "-")
			start, err1 := strconv.ParseUint(lo, 16, 64)
			end, err2 := strconv.ParseUint(hi, 16, 64)
			if fields[5] == exe && !strings.Contains(fields[1], "w") && err1 == nil && err2 == nil {
				trim = append(trim, vma{start, end})
				cur = &trim[len(trim)-1]
			}
		case cur != nil && len(fields) >= 2 && fields[0] == "Anonymous:" && fields[1] != "0":
			// Written after mapping (e.g. relocations made read-only):
			// dropping would lose them.
			trim = trim[:len(trim)-1]
			cur = nil
		}
	}
	for _, m := range trim {
		for _, advice := range []uintptr{unix.MADV_NOHUGEPAGE, unix.MADV_DONTNEED} {
			_, _, _ = unix.Syscall(unix.SYS_MADVISE, uintptr(m.start), uintptr(m.end-m.start), advice)
		}
	}
}
