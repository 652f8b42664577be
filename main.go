// Command noderun runs Kubernetes Pod manifests on one machine, without an
// API server, by driving containerd and CNI directly.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	ctrdlog "github.com/containerd/log"
	"github.com/urfave/cli/v2"

	"github.com/noderun/noderun/crilog"
	nrcli "github.com/noderun/noderun/internal/cli"
	"github.com/noderun/noderun/internal/memtrim"
	"github.com/noderun/noderun/runner/sandbox"
	"github.com/noderun/noderun/systemd"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := applyEnvFile(systemd.EnvFile); err != nil && !childMode(os.Args) {
		fmt.Fprintln(os.Stderr, "noderun:", err)
		os.Exit(1)
	}
	if err := newApp().RunContext(ctx, os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "noderun:", err)
		os.Exit(1)
	}
}

// newApp is the command line; docs/reference/flags.md is generated from it
// (docs_test.go).
func newApp() *cli.App {
	return &cli.App{
		Name:  "noderun",
		Usage: "run Kubernetes Pod manifests on containerd, without an API server",
		Description: "Runs the Pod manifests given by --manifests and --manifest-url, as the kubelet runs static pods.\n" +
			"Documentation: README.md and docs/ in the source, /usr/share/doc/noderun with the package;\n" +
			"every flag and command: docs/reference/flags.md.",
		Version: version,
		Flags:   flags(),
		Action:  longLived(runNode),
		Commands: append([]*cli.Command{
			{Name: "version", Usage: "print the version", Description: "See docs/operating.md, Updates.", Action: func(*cli.Context) error {
				fmt.Println("noderun", version)
				return nil
			}},
			imagesCommand(),
			resetCommand(),
			installCommand(),
			{
				// containerd's shim runs this as the containers' log driver.
				Name: "log-driver", Hidden: true, ArgsUsage: "[MAX-SIZE:MAX-FILES:]PATH",
				// Most hand their pipes to the collector and exit at once;
				// only one writing the log itself lives long enough to trim.
				Action: func(c *cli.Context) error { return crilog.ServeFDs(c.Args().First(), "", memtrim.TrimExecutable) },
			},
			{
				// The node's one log collector, started by noderun (logcollector.go).
				Name: "log-collector", Hidden: true, ArgsUsage: "SOCKET",
				Action: longLived(func(c *cli.Context) error { return runCollector(c.Context, c.Args().First()) }),
			},
			{
				// PID 1 of a pod with shareProcessNamespace (runner/sandbox/pause.go).
				Name: "pause", Hidden: true, ArgsUsage: "ROOT",
				Action: longLived(func(c *cli.Context) error { return sandbox.RunPause(c.Args().First()) }),
			},
		}, nrcli.Commands()...),
	}
}

// longLived is for the processes that run as long as the node or a pod:
// they first give back the binary pages that starting touched
// (memtrim.TrimExecutable). The commands and a log driver that hands its pipes over
// exit within milliseconds, and the trim (a read of /proc/self/smaps) would
// only delay them; for a driver it delays the container's start.
func longLived(action cli.ActionFunc) cli.ActionFunc {
	return func(c *cli.Context) error {
		memtrim.TrimExecutable()
		return action(c)
	}
}

func newLogger(c *cli.Context) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.String("log-level"))); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	// The containerd client logs through logrus (e.g. every failed pull
	// attempt at info level); our own log says what matters.
	_ = ctrdlog.SetLevel("warn")
	opts := &slog.HandlerOptions{Level: level}
	format := c.String("log-format")
	if !c.IsSet("log-format") && systemd.StderrIsJournal() {
		format = "journal"
	}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	case "journal":
		return slog.New(systemd.NewJournalHandler(level, "noderun", nil, slog.NewTextHandler(os.Stderr, opts))), nil
	}
	return nil, fmt.Errorf("--log-format: %q is not text, json or journal", format)
}
