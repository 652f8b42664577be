package memtrim

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// exeRSS sums the resident kB of the test binary's read-only mappings; with
// populate it first faults every page of them in (MADV_POPULATE_READ), so
// that what is resident before a trim does not depend on what ran before.
func exeRSS(t *testing.T, populate bool) int {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Skip("no /proc/self/smaps")
	}
	defer f.Close()
	total, ours := 0, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		switch {
		case len(fields) >= 6 && strings.Contains(fields[0], "-"):
			ours = fields[5] == exe && !strings.Contains(fields[1], "w")
			if ours && populate {
				lo, hi, _ := strings.Cut(fields[0], "-")
				start, _ := strconv.ParseUint(lo, 16, 64)
				end, _ := strconv.ParseUint(hi, 16, 64)
				// An older kernel refuses the advice: "before" is then what happens to be resident.
				_, _, _ = unix.Syscall(unix.SYS_MADVISE, uintptr(start), uintptr(end-start), unix.MADV_POPULATE_READ)
			}
		case ours && len(fields) >= 2 && fields[0] == "Rss:":
			kb, _ := strconv.Atoi(fields[1])
			total += kb
		}
	}
	return total
}

func TestTrimExecutableDropsResidentBinaryPages(t *testing.T) {
	exeRSS(t, true)
	before := exeRSS(t, false)
	TrimExecutable()
	after := exeRSS(t, false)
	t.Logf("resident read-only pages of the binary: %d kB before, %d kB after", before, after)
	// Pages come back as soon as they are touched (with large folios, the
	// whole folio at once), so only a clear drop is required.
	if after > before*3/4 {
		t.Fatalf("resident binary pages %d kB -> %d kB; want a clear drop", before, after)
	}
	// The process still runs fine: code and read-only data fault back in.
	if got := strings.Repeat("ok", 2); got != "okok" {
		t.Fatal(got)
	}
}
