package containerd

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/errdefs"

	"github.com/noderun/noderun/runner"
)

func execSync(t *testing.T, rt *Runtime, id string, timeout time.Duration, cmd ...string) runner.ExecResult {
	t.Helper()
	res, err := rt.ExecSync(context.Background(), id, cmd, timeout)
	if err != nil {
		t.Fatalf("ExecSync %q: %v", cmd, err)
	}
	return res
}

func TestExecSync(t *testing.T) {
	rt := testRuntime(t)
	cfg := testConfig(t, rt, "exec", "sleep", "3600")
	cfg.User = runner.ProcessUser{User: "nobody"}
	cfg.Env = append(cfg.Env, "GREETING=hello")
	cfg.WorkingDir = "/tmp"
	startContainer(t, rt, cfg)
	exits, err := rt.Exits(t.Context())
	if err != nil {
		t.Fatal(err)
	}

	t.Run("output and exit code", func(t *testing.T) {
		res := execSync(t, rt, cfg.ID, 10*time.Second, "sh", "-c", "echo out; echo err >&2; exit 3")
		if string(res.Output) != "out\nerr\n" || res.ExitCode != 3 || res.TimedOut {
			t.Fatalf("result = %q, exit %d, timed out %t; want \"out\\nerr\\n\", 3, false", res.Output, res.ExitCode, res.TimedOut)
		}
	})
	t.Run("container's user, env and cwd", func(t *testing.T) {
		res := execSync(t, rt, cfg.ID, 10*time.Second, "sh", "-c", `id -u; echo "$GREETING"; pwd`)
		if want := "65534\nhello\n/tmp\n"; string(res.Output) != want {
			t.Fatalf("output = %q, want %q", res.Output, want)
		}
	})
	t.Run("no timeout", func(t *testing.T) {
		if res := execSync(t, rt, cfg.ID, 0, "true"); res.ExitCode != 0 || res.TimedOut {
			t.Fatalf("result = %+v", res)
		}
	})
	t.Run("output cut at 16 KiB each", func(t *testing.T) {
		res := execSync(t, rt, cfg.ID, 10*time.Second, "sh", "-c",
			`head -c 40000 /dev/zero | tr '\0' a; head -c 40000 /dev/zero | tr '\0' b >&2`)
		want := append(bytes.Repeat([]byte("a"), execOutputCap), bytes.Repeat([]byte("b"), execOutputCap)...)
		if !bytes.Equal(res.Output, want) {
			t.Fatalf("output: %d bytes, want 16 KiB of a then 16 KiB of b", len(res.Output))
		}
	})
	t.Run("timeout kills", func(t *testing.T) {
		start := time.Now()
		res := execSync(t, rt, cfg.ID, time.Second, "sleep", "30")
		took := time.Since(start)
		t.Logf("timed out after %v", took)
		if !res.TimedOut || res.ExitCode != 137 {
			t.Fatalf("result = %+v, want TimedOut and exit 137", res)
		}
		// Not before the timeout, and well before the 30 s sleep; the
		// margin is for a busy machine, where an exec starts slowly.
		if took < time.Second || took > 15*time.Second {
			t.Fatalf("ExecSync took %v, want about 1s", took)
		}
		ps := execSync(t, rt, cfg.ID, 10*time.Second, "ps", "-o", "args")
		if !strings.Contains(string(ps.Output), "sleep 3600") {
			t.Fatalf("ps does not list the container's process:\n%s", ps.Output)
		}
		if strings.Contains(string(ps.Output), "sleep 30\n") {
			t.Fatalf("the timed-out process still runs:\n%s", ps.Output)
		}
	})
	t.Run("a background child holding the output", func(t *testing.T) {
		start := time.Now()
		res := execSync(t, rt, cfg.ID, 10*time.Second, "sh", "-c", "sleep 32 & echo started")
		took := time.Since(start)
		t.Logf("returned after %v", took)
		if string(res.Output) != "started\n" || res.ExitCode != 0 || res.TimedOut {
			t.Fatalf("result = %q, exit %d, timed out %t", res.Output, res.ExitCode, res.TimedOut)
		}
		if took > execDrainTimeout+15*time.Second { // far below the child's 32 s
			t.Fatalf("ExecSync took %v waiting for the child's output", took)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		if _, err := rt.ExecSync(ctx, cfg.ID, []string{"sleep", "31"}, 0); err == nil {
			t.Fatal("ExecSync outlived its context")
		}
		eventually(t, 30*time.Second, "the cancelled process is killed", func() bool {
			ps := execSync(t, rt, cfg.ID, 10*time.Second, "ps", "-o", "args")
			return !strings.Contains(string(ps.Output), "sleep 31")
		})
	})
	t.Run("no FIFOs left", func(t *testing.T) {
		// Execs whose output a child held are deleted in the background.
		eventually(t, 15*time.Second, "the FIFO directory is empty", func() bool {
			left, err := os.ReadDir(rt.fifoDir)
			if err != nil {
				t.Fatal(err)
			}
			return len(left) == 0
		})
	})
	t.Run("exec exits are not container exits", func(t *testing.T) {
		if err := rt.StopContainer(context.Background(), cfg.ID, 0); err != nil {
			t.Fatal(err)
		}
		select {
		case e := <-exits:
			if e.ContainerID != cfg.ID || e.ExitCode != 137 || e.PodUID != string(cfg.Pod.UID) {
				t.Fatalf("first exit event = %+v, want the container's own SIGKILL", e)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no exit event")
		}
	})
	t.Run("stopped container", func(t *testing.T) {
		_, err := rt.ExecSync(context.Background(), cfg.ID, []string{"true"}, time.Second)
		if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "not running") {
			t.Fatalf("err = %v, want a not-running failed precondition", err)
		}
	})
	t.Run("missing container", func(t *testing.T) {
		_, err := rt.ExecSync(context.Background(), "nonexistent", []string{"true"}, time.Second)
		if !errdefs.IsNotFound(err) {
			t.Fatalf("err = %v, want not found", err)
		}
	})
}

// eventually polls cond until it holds or d passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: not so that %s", d, what)
		}
	}
}

func TestCappedBuffer(t *testing.T) {
	b := &cappedBuffer{limit: 5}
	for _, w := range []string{"abc", "defg", "hij"} {
		if n, err := b.Write([]byte(w)); n != len(w) || err != nil {
			t.Fatalf("Write(%q) = %d, %v; want all of it taken", w, n, err)
		}
	}
	if got := string(b.Bytes()); got != "abcde" {
		t.Fatalf("kept %q, want abcde", got)
	}
}
