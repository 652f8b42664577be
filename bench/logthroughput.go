package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/noderun/noderun/internal/testnode"
	v1 "k8s.io/api/core/v1"
)

// logLine is what the throughput container writes, over and over: a log
// line of a typical length (100 bytes with its newline).
var logLine = strings.Repeat("x", 99)

// logThroughput is one container writing as fast as it can: the MB/s its
// log takes through noderun's collector and the CPU noderun's side
// (collector and daemon) spends per MB, beside cat copying the same stream
// into a file.
type logThroughput struct {
	mbps, cpuPerMB           []float64 // through the collector
	floorMBps, floorCPUPerMB []float64 // cat
}

func (n *node) collectorSocket() string { return filepath.Join(n.dir, "run", "log-collector.sock") }

// collectorPID finds the node's log collector in /proc.
func (n *node) collectorPID() (int, error) {
	if pids := testnode.CollectorPIDs(n.proc.Path, filepath.Join(n.dir, "run")); len(pids) > 0 {
		return pids[0], nil
	}
	return 0, errors.New("no log collector runs")
}

// measureLogThroughput runs the noderun side and the floor, window each.
func (b *bench) measureLogThroughput(ctx context.Context, window time.Duration) error {
	b.logf("log throughput: one container writing for %s", window)
	names := []string{"logtp"}
	if _, err := b.node.writeManifestsWith(names, func(c *v1.Container) {
		c.Command = []string{"sh", "-c", "trap 'exit 0' TERM; yes " + logLine + " & wait"}
	}); err != nil {
		return err
	}
	if _, err := b.node.waitRunning(ctx, names, 100*time.Millisecond, waitTimeout); err != nil {
		return err
	}
	pid, err := b.node.collectorPID()
	if err != nil {
		return err
	}
	read0, cpu0, err := b.loggingCounters(pid)
	if err != nil {
		return err
	}
	if err := sleep(ctx, window); err != nil {
		return err
	}
	read1, cpu1, err := b.loggingCounters(pid)
	if err != nil {
		return err
	}
	if _, err := b.node.removeManifests(names); err != nil {
		return err
	}
	if err := b.node.waitNoPods(ctx, waitTimeout); err != nil {
		return err
	}
	mb := float64(read1-read0) / 1e6
	if mb <= 0 {
		return errors.New("log throughput: the collector read nothing")
	}
	b.m.logTP.mbps = append(b.m.logTP.mbps, mb/window.Seconds())
	b.m.logTP.cpuPerMB = append(b.m.logTP.cpuPerMB, (cpu1-cpu0).Seconds()*1000/mb)

	mbps, cpuPerMB, err := catFloor(ctx, filepath.Join(b.node.dir, "logs"), window)
	if err != nil {
		return fmt.Errorf("log throughput floor: %w", err)
	}
	b.m.logTP.floorMBps = append(b.m.logTP.floorMBps, mbps)
	b.m.logTP.floorCPUPerMB = append(b.m.logTP.floorCPUPerMB, cpuPerMB)
	return nil
}

// loggingCounters are the bytes the collector has read (its pipes) and the
// CPU time of the collector and the daemon together.
func (b *bench) loggingCounters(collector int) (read int64, cpu time.Duration, err error) {
	read, err = procRchar(collector)
	if err != nil {
		return 0, 0, err
	}
	c1, err := testnode.CPUTime(collector)
	if err != nil {
		return 0, 0, err
	}
	c2, err := b.node.cpuTime()
	return read, c1 + c2, err
}

// catFloor pipes yes into cat into a file in dir for window: the bytes/s
// and cat's CPU ms per MB.
func catFloor(ctx context.Context, dir string, window time.Duration) (mbps, cpuPerMB float64, err error) {
	out, err := os.CreateTemp(dir, "floor-*.log")
	if err != nil {
		return 0, 0, err
	}
	defer os.Remove(out.Name())
	defer out.Close()
	yes := exec.Command("yes", logLine)
	cat := exec.Command("cat")
	cat.Stdout = out
	if cat.Stdin, err = yes.StdoutPipe(); err != nil {
		return 0, 0, err
	}
	if err := yes.Start(); err != nil {
		return 0, 0, err
	}
	if err := cat.Start(); err != nil {
		yes.Process.Kill()
		yes.Wait()
		return 0, 0, err
	}
	serr := sleep(ctx, window)
	yes.Process.Kill()
	yes.Wait()
	if err := cat.Wait(); err != nil {
		return 0, 0, err
	}
	if serr != nil {
		return 0, 0, serr
	}
	fi, err := out.Stat()
	if err != nil {
		return 0, 0, err
	}
	ru := cat.ProcessState.SysUsage().(*syscall.Rusage)
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	mb := float64(fi.Size()) / 1e6
	return mb / window.Seconds(), cpu.Seconds() * 1000 / mb, nil
}

// procRchar is a process's rchar from /proc/<pid>/io: bytes read by read
// system calls, here the collector's pipes.
func procRchar(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "rchar:"); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("no rchar in /proc/%d/io", pid)
}

// logThroughputRows are the throughput rows, when measured.
func (m *measurements) logThroughputRows() []Row {
	if len(m.logTP.mbps) == 0 {
		return nil
	}
	return []Row{
		Row{Key: "log_throughput", Measure: "log throughput, one container writing as fast as it can (floor: cat into a file)", Unit: "MB/s",
			Noderun: statsOf(m.logTP.mbps), Floor: statsOf(m.logTP.floorMBps)}.finish(),
		Row{Key: "log_cpu_per_mb", Measure: "CPU per MB logged, collector + noderun (floor: cat)", Unit: "ms",
			Noderun: statsOf(m.logTP.cpuPerMB), Floor: statsOf(m.logTP.floorCPUPerMB)}.finish(),
	}
}
