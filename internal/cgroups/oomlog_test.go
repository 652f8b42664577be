package cgroups

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// kmsg hands out one record per read, as /dev/kmsg does, then EAGAIN; an
// EPIPE (records overwritten) is read past.
func kmsg(records ...string) func([]byte) (int, error) {
	return func(p []byte) (int, error) {
		if len(records) == 0 {
			return 0, unix.EAGAIN
		}
		r := records[0]
		records = records[1:]
		if r == "EPIPE" {
			return 0, unix.EPIPE
		}
		return copy(p, r), nil
	}
}

// The systemd driver's case: the scope is gone, the kernel's log names it
// as the killed task's cgroup (the limit hit was the pod slice's).
func TestKernelOOMKillLogged(t *testing.T) {
	l := Layout{Driver: Systemd, Unified: true}
	path := l.ContainerPath(l.PodParent(Burstable, sandbox), "ctr-main-0")
	scope := l.Path(path)
	slice := l.Path(l.PodParent(Burstable, sandbox))
	kill := "3,812,45000000,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=" +
		slice + ",task_memcg=" + scope + ",task=dd,pid=4242,uid=0\n SUBSYSTEM=memory\n"
	other := "3,900,46000000,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=" +
		slice + ",task_memcg=" + scope + "x,task=dd,pid=4243,uid=0\n"
	noise := "6,811,44000000,-;dd invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=1000\n"
	tests := []struct {
		name    string
		records []string
		since   time.Duration
		want    bool
	}{
		{"the kill, after the run started", []string{noise, "EPIPE", kill}, 44 * time.Second, true},
		{"a kill of an earlier run with the same cgroup", []string{noise, kill}, 46 * time.Second, false},
		{"another container's kill", []string{noise, other}, 0, false},
		{"no kill", []string{noise}, 0, false},
	}
	for _, tt := range tests {
		if got := oomKillLogged(kmsg(tt.records...), scope, tt.since); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}

// Reading the host's own log ends at its end: it does not wait for the
// next record.
func TestKernelOOMKillReadsToTheEnd(t *testing.T) {
	if (Layout{}).KernelOOMKill("/noderun-test-no-such-cgroup", 0) {
		t.Error("an OOM kill found in a cgroup that never existed")
	}
}
