package cgroups

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// writeFiles writes name -> content below dir.
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

const psiFile = "some avg10=1.50 avg60=0.25 avg300=0.00 total=123456\nfull avg10=0.50 avg60=0.10 avg300=0.00 total=2345\n"

// Each layout reads its own files from where they are on a fake tree: v1
// from the cpuacct and memory hierarchies, v2 from the one unified dir.
func TestUsageOnEachLayout(t *testing.T) {
	for name, l := range layouts(t.TempDir()) {
		t.Run(name, func(t *testing.T) {
			path := l.ContainerPath(l.PodParent(Burstable, sandbox), "ctr")
			if l.Unified {
				writeFiles(t, l.Dir(path, ""), map[string]string{
					"cpu.stat":            "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\nnr_periods 0\n",
					"memory.current":      "104857600\n",
					"memory.stat":         "anon 73400320\nfile 31457280\ninactive_file 20971520\nactive_file 10485760\npgfault 7\npgmajfault 1\n",
					"memory.max":          "max\n",
					"memory.swap.current": "0\n",
					"cpu.pressure":        psiFile,
					"memory.pressure":     psiFile,
					"io.pressure":         psiFile,
				})
			} else {
				writeFiles(t, l.Dir(path, "cpuacct"), map[string]string{
					"cpuacct.usage": "2500000000\n",
					"cpuacct.stat":  "user 200\nsystem 50\n",
				})
				writeFiles(t, l.Dir(path, "memory"), map[string]string{
					"memory.usage_in_bytes": "104857600\n",
					"memory.limit_in_bytes": "9223372036854771712\n",
					"memory.stat": "cache 1\nrss 2\ntotal_cache 31457280\ntotal_rss 73400320\ntotal_inactive_file 20971520\n" +
						"total_active_file 10485760\ntotal_pgfault 7\ntotal_pgmajfault 1\n",
				})
			}
			u, err := l.Usage(path)
			if err != nil {
				t.Fatal(err)
			}
			want := Usage{CPU: 2.5e9, CPUUser: 2e9, CPUSystem: 5e8, Memory: 100 << 20, WorkingSet: 80 << 20,
				RSS: 70 << 20, Cache: 30 << 20, PageFaults: 7, MajorPageFaults: 1}
			psi := u.CPUPressure
			u.CPUPressure, u.MemoryPressure, u.IOPressure = nil, nil, nil
			if u != want {
				t.Errorf("usage\n got %+v\nwant %+v", u, want)
			}
			if l.Unified != (psi != nil) {
				t.Errorf("PSI %+v on unified=%v", psi, l.Unified)
			}
			if psi != nil && (psi.Some != PressureLine{1.5, 0.25, 0, 123456} || psi.Full.Total != 2345) {
				t.Errorf("PSI %+v", psi)
			}
			cpu, err := l.CPU(path)
			if err != nil || cpu != 2.5e9 {
				t.Errorf("CPU = %d, %v", cpu, err)
			}
		})
	}
}

// The working set is usage less inactive file pages, and never negative
// (the counters are read apart and can cross).
func TestWorkingSet(t *testing.T) {
	for _, tt := range []struct{ usage, inactive, want uint64 }{
		{100, 30, 70}, {100, 0, 100}, {100, 100, 0}, {100, 150, 0}, {0, 0, 0},
	} {
		if got := workingSet(tt.usage, tt.inactive); got != tt.want {
			t.Errorf("workingSet(%d, %d) = %d, want %d", tt.usage, tt.inactive, got, tt.want)
		}
	}
}

// A limit is reported only when the cgroup has one.
func TestMemoryLimit(t *testing.T) {
	fs := t.TempDir()
	l := Layout{Driver: Cgroupfs, Unified: true, FS: fs}
	writeFiles(t, l.Dir("/c", ""), map[string]string{
		"cpu.stat": "usage_usec 1\n", "memory.current": "10\n", "memory.stat": "inactive_file 1\n", "memory.max": "67108864\n",
	})
	if u, err := l.Usage("/c"); err != nil || u.MemoryLimit != 64<<20 {
		t.Errorf("limit %d, %v", u.MemoryLimit, err)
	}
}

// A cgroup that is gone (its container ended) says so.
func TestUsageOfMissingCgroup(t *testing.T) {
	for name, l := range layouts(t.TempDir()) {
		if _, err := l.Usage("/noderun/gone"); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// A bad file is an error naming it, never a zero.
func TestUsageRefusesGarbage(t *testing.T) {
	fs := t.TempDir()
	l := Layout{Driver: Cgroupfs, Unified: true, FS: fs}
	writeFiles(t, l.Dir("/c", ""), map[string]string{"cpu.stat": "usage_usec lots\n"})
	if _, err := l.Usage("/c"); err == nil {
		t.Error("no error for a bad cpu.stat")
	}
}

func TestNodeUsage(t *testing.T) {
	proc := t.TempDir()
	writeFiles(t, proc, map[string]string{
		"meminfo":         "MemTotal:       4096 kB\nMemFree:        1024 kB\nInactive(file):  512 kB\nAnonPages: 1000 kB\nCached: 700 kB\n",
		"pressure/cpu":    psiFile,
		"pressure/memory": psiFile,
	})
	v2 := Layout{Unified: true, FS: t.TempDir()}
	writeFiles(t, v2.fs(), map[string]string{"cpu.stat": "usage_usec 3000000\nuser_usec 2000000\nsystem_usec 1000000\n"})
	u, err := v2.NodeUsage(proc)
	if err != nil {
		t.Fatal(err)
	}
	if u.CPU != 3e9 || u.Memory != 3072<<10 || u.WorkingSet != 2560<<10 || u.CPUPressure == nil || u.IOPressure != nil {
		t.Errorf("v2 node usage %+v", u)
	}
	v1 := Layout{FS: t.TempDir()}
	writeFiles(t, v1.fs(), map[string]string{
		"cpuacct/cpuacct.usage": "5000000000\n", "cpuacct/cpuacct.stat": "user 300\nsystem 200\n",
		"memory/memory.usage_in_bytes": "8192\n", "memory/memory.stat": "total_inactive_file 4096\n",
		"memory/memory.limit_in_bytes": "9223372036854771712\n",
	})
	if u, err = v1.NodeUsage(proc); err != nil || u.CPU != 5e9 || u.WorkingSet != 4096 {
		t.Errorf("v1 node usage %+v, %v", u, err)
	}
}
