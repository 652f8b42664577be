package runner

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// TestCrashBackoffCap: the kubelet's crash-loop backoff, 0 then 10 s
// doubling, capped at crashLoopBackOff.maxContainerRestartPeriod (the
// first delay lowered to the cap when it is below 10 s), and started over
// after 600 s without a crash whatever the cap.
func TestCrashBackoffCap(t *testing.T) {
	s := time.Second
	for _, tc := range []struct {
		max  time.Duration
		want []time.Duration
	}{
		{0, []time.Duration{0, 10 * s, 20 * s, 40 * s, 80 * s, 160 * s, 300 * s, 300 * s}},
		{300 * s, []time.Duration{0, 10 * s, 20 * s, 40 * s, 80 * s, 160 * s, 300 * s, 300 * s}},
		{30 * s, []time.Duration{0, 10 * s, 20 * s, 30 * s, 30 * s}},
		{10 * s, []time.Duration{0, 10 * s, 10 * s}},
		{5 * s, []time.Duration{0, 5 * s, 5 * s, 5 * s}},
		{s, []time.Duration{0, s, s, s}},
	} {
		b := crashBackoff(tc.max)
		now := t0
		var got []time.Duration
		for i := range tc.want {
			w := b.waitFor(fmt.Sprint("run", i), now, now)
			got = append(got, w)
			now = now.Add(w + time.Millisecond) // crashes again right after its restart
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("cap %s: waits %v, want %v", tc.max, got, tc.want)
		}
	}
	b := crashBackoff(30 * s)
	for i := range 4 {
		b.waitFor(fmt.Sprint("run", i), t0, t0)
	}
	later := t0.Add(backoffExpiry + s)
	if w := b.waitFor("late", later, later); w != 0 {
		t.Errorf("a crash %s after the last waits %s, want 0: the backoff starts over", backoffExpiry+s, w)
	}
}

// TestEngineCrashLoopMaxBackoff: with the cap at 2 s the second crash
// waits 2 s, not 10 s (fake clock).
func TestEngineCrashLoopMaxBackoff(t *testing.T) {
	f := startEngineWith(t, func(c *Config) { c.CrashLoopMaxBackoff = 2 * time.Second })
	f.send(testPod("u1", "web", "Always"))
	waitFor(t, "first start", func() bool { return f.rt.startedCount() == 1 })
	f.rt.exit(f.rt.started[0].ID, 1)
	waitFor(t, "immediate restart", func() bool { return f.rt.startedCount() == 2 })
	f.rt.exit(f.rt.started[1].ID, 1)
	waitFor(t, "a 2s backoff armed", func() bool { return f.clock.timerIn(2 * time.Second) })
	if n := f.rt.startedCount(); n != 2 {
		t.Fatalf("restarted before its backoff (starts=%d)", n)
	}
	f.clock.Advance(2 * time.Second)
	waitFor(t, "restart after 2s", func() bool { return f.rt.startedCount() == 3 })
}
