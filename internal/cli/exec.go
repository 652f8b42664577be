package cli

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v2"
	"golang.org/x/term"

	"github.com/noderun/noderun/internal/execio"
	"github.com/noderun/noderun/kubeapi"
)

func execCommand() *cli.Command {
	return &cli.Command{
		Name:                   "exec",
		UseShortOptionHandling: true, // -it
		Usage:                  "run a command in a container, as `kubectl exec` does, through the node's Kubernetes API (admin token); exits with the command's code",
		Description:            "See docs/kubectl.md.",
		ArgsUsage:              "POD -- COMMAND [ARG...]",
		Flags: append(podFlags(),
			&cli.BoolFlag{Name: "stdin", Aliases: []string{"i"}, Usage: "pass stdin to the command"},
			&cli.BoolFlag{Name: "tty", Aliases: []string{"t"}, Usage: "give the command a terminal (with -i and a terminal on stdin)"},
		),
		Action: func(c *cli.Context) error {
			args := c.Args().Slice()
			if len(args) > 1 && args[1] == "--" {
				args = append(args[:1], args[2:]...)
			}
			if len(args) < 2 {
				return fmt.Errorf("exec: give a pod name and a command: noderun exec POD -- COMMAND [ARG...]")
			}
			a, err := apiClient(c, true)
			if err != nil {
				return err
			}
			return runRemote(c, a, podPath(c.String("namespace"), args[0], "exec"), url.Values{"command": args[1:]}, c.Bool("stdin"), c.Bool("tty"))
		},
	}
}

// runRemote runs the exec or attach at path with this process's streams,
// as kubectl does: stdin with withStdin, a terminal in raw mode with tty
// when stdin is one, stderr apart otherwise. It exits with the command's
// exit code.
func runRemote(c *cli.Context, a *client, path string, q url.Values, withStdin, wantTTY bool) error {
	tty := wantTTY && withStdin && term.IsTerminal(int(os.Stdin.Fd()))
	if wantTTY && !tty {
		fmt.Fprintln(os.Stderr, "Unable to use a TTY - input is not a terminal or the -i flag is not given")
	}
	q.Set("stdout", "true")
	s := execio.ExecIO{Stdout: os.Stdout, TTY: tty}
	if withStdin {
		q.Set("stdin", "true")
		s.Stdin = os.Stdin
	}
	if tty {
		q.Set("tty", "true")
		restore, sizes, err := rawTerminal()
		if err != nil {
			return err
		}
		defer restore()
		s.Resize = sizes
	} else {
		q.Set("stderr", "true")
		s.Stderr = os.Stderr
	}
	if ctr := c.String("container"); ctr != "" {
		q.Set("container", ctr)
	}
	err := kubeapi.RemoteCommand(c.Context, a.url(path, q), a.tls, a.token, s)
	var exit *kubeapi.ExitError
	if errors.As(err, &exit) {
		return cli.Exit("", exit.Code)
	}
	return err
}

// rawTerminal puts the terminal on stdin in raw mode, as kubectl exec -t
// does, and sends its size now and on each SIGWINCH.
func rawTerminal() (restore func(), sizes <-chan execio.TerminalSize, err error) {
	fd := int(os.Stdin.Fd())
	old, err := term.MakeRaw(fd)
	if err != nil {
		return nil, nil, fmt.Errorf("raw terminal: %w", err)
	}
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	out := make(chan execio.TerminalSize, 1)
	stop := make(chan struct{})
	go func() {
		defer close(out)
		for {
			if w, h, err := term.GetSize(fd); err == nil {
				select {
				case out <- execio.TerminalSize{Width: uint16(w), Height: uint16(h)}:
				case <-stop:
					return
				}
			}
			select {
			case <-winch:
			case <-stop:
				return
			}
		}
	}()
	return func() {
		signal.Stop(winch)
		close(stop)
		term.Restore(fd, old)
	}, out, nil
}
