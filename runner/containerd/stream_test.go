package containerd

import (
	"bytes"
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/noderun/noderun/internal/execio"
	"github.com/noderun/noderun/runner"
)

func TestExec(t *testing.T) {
	rt := testRuntime(t)
	cfg := testConfig(t, rt, "exec-streams", "sleep", "3600")
	cfg.User = runner.ProcessUser{User: "nobody"}
	cfg.WorkingDir = "/tmp"
	startContainer(t, rt, cfg)

	t.Run("stdin, stdout, stderr and exit code", func(t *testing.T) {
		var out, errOut bytes.Buffer
		code, err := rt.Exec(context.Background(), cfg.ID, []string{"sh", "-c", "id -u; pwd; cat; echo err >&2; exit 7"},
			execio.ExecIO{Stdin: strings.NewReader("from stdin\n"), Stdout: &out, Stderr: &errOut})
		if err != nil {
			t.Fatal(err)
		}
		if want := "65534\n/tmp\nfrom stdin\n"; out.String() != want || errOut.String() != "err\n" || code != 7 {
			t.Errorf("stdout %q, stderr %q, exit %d; want %q, \"err\\n\", 7", out.String(), errOut.String(), code, want)
		}
	})
	t.Run("stdin arrives whole and ends, execs side by side", func(t *testing.T) {
		// Telling the shim that stdin ended could overtake the bytes
		// (input lost, or a command that never saw its end), rarely:
		// many execs here, short input, some none.
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 20 {
					in := strings.Repeat("x", (w+i)%3)
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					var out bytes.Buffer
					code, err := rt.Exec(ctx, cfg.ID, []string{"sh", "-c", "cat; exit 3"}, execio.ExecIO{Stdin: strings.NewReader(in), Stdout: &out})
					cancel()
					if err != nil || code != 3 || out.String() != in {
						t.Errorf("exec %d.%d: %v, exit %d, output %q; want 3 and %q", w, i, err, code, out.String(), in)
						return
					}
				}
			}()
		}
		wg.Wait()
	})
	t.Run("terminal", func(t *testing.T) {
		var out bytes.Buffer
		sizes := make(chan execio.TerminalSize, 1)
		sizes <- execio.TerminalSize{Width: 123, Height: 45}
		// The first size is the terminal's from the start; a later one
		// resizes it. Stdin stays open: its end hangs the terminal up.
		stdin, stdinW := io.Pipe()
		defer stdinW.Close()
		go func() {
			time.Sleep(500 * time.Millisecond)
			sizes <- execio.TerminalSize{Width: 99, Height: 11}
		}()
		code, err := rt.Exec(context.Background(), cfg.ID,
			[]string{"sh", "-c", `stty size; for i in $(seq 50); do s=$(stty size); [ "$s" = "11 99" ] && break; sleep 0.1; done; echo "$s"; [ -t 0 ] && echo tty; echo err >&2`},
			execio.ExecIO{Stdin: stdin, Stdout: &out, TTY: true, Resize: sizes})
		if err != nil {
			t.Fatal(err)
		}
		// A terminal turns \n into \r\n and carries stderr too.
		if want := "45 123\r\n11 99\r\ntty\r\nerr\r\n"; out.String() != want || code != 0 {
			t.Errorf("output %q, exit %d; want %q, 0", out.String(), code, want)
		}
	})
	t.Run("client gone kills the command", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		start := time.Now()
		if _, err := rt.Exec(ctx, cfg.ID, []string{"sleep", "60"}, execio.ExecIO{}); err == nil {
			t.Fatal("exec outlived its context without an error")
		}
		if took := time.Since(start); took > 30*time.Second {
			t.Errorf("exec took %v after its context ended", took)
		}
		ps := execSync(t, rt, cfg.ID, 10*time.Second, "ps", "-o", "args")
		if strings.Contains(string(ps.Output), "sleep 60") {
			t.Errorf("the command still runs:\n%s", ps.Output)
		}
	})
}
