package cgroups

import (
	"errors"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// KernelOOMKill reports whether the kernel's log (/dev/kmsg) records an OOM
// kill of a process in the cgroup at cgroupsPath at or after since (time
// since boot). It is the evidence left when the cgroup itself is gone: with
// the systemd driver, systemd removes a container's scope as soon as its
// last process died, before its memory.events can be read, and a kill at
// the pod slice's limit may come before the shim watches the scope. The
// kernel names the killed task's cgroup in its "oom-kill:" line (since
// Linux 4.19), which is what the kubelet's OOM watcher reads too.
func (l Layout) KernelOOMKill(cgroupsPath string, since time.Duration) bool {
	fd, err := unix.Open("/dev/kmsg", unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	// A raw read, not an os.File's: the runtime poller would wait for the
	// next record where the end of the log is wanted.
	return oomKillLogged(func(p []byte) (int, error) { return unix.Read(fd, p) }, l.Path(cgroupsPath), since)
}

// oomKillLogged reads kmsg records, one per read as /dev/kmsg returns them,
// until the end of the log (EAGAIN), and looks for an oom-kill line naming
// cgroup as the task's memory cgroup.
func oomKillLogged(read func([]byte) (int, error), cgroup string, since time.Duration) bool {
	buf := make([]byte, 8192) // the kernel's longest record is 8 KiB less its prefix
	for {
		n, err := read(buf)
		if errors.Is(err, unix.EPIPE) {
			continue // records overwritten while reading: read on
		}
		if err != nil || n <= 0 {
			return false
		}
		if oomKillRecord(string(buf[:n]), cgroup, since) {
			return true
		}
	}
}

// oomKillRecord parses one kmsg record, "prio,seq,usec,flags;message\n"
// with continuation lines after the message, for
// "oom-kill:...,task_memcg=<cgroup>,task=...".
func oomKillRecord(rec, cgroup string, since time.Duration) bool {
	head, msg, ok := strings.Cut(rec, ";")
	f := strings.Split(head, ",")
	if !ok || len(f) < 3 {
		return false
	}
	us, err := strconv.ParseInt(f[2], 10, 64)
	if err != nil || time.Duration(us)*time.Microsecond < since {
		return false
	}
	msg, _, _ = strings.Cut(msg, "\n")
	fields, ok := strings.CutPrefix(msg, "oom-kill:")
	if !ok {
		return false
	}
	_, rest, ok := strings.Cut(fields, ",task_memcg=")
	memcg, _, _ := strings.Cut(rest, ",task=")
	return ok && memcg == cgroup
}
