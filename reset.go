package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/noderun/noderun/cni"
	"github.com/noderun/noderun/internal/layout"
	"github.com/noderun/noderun/runner"
	"github.com/noderun/noderun/runner/containerd/daemon"
	"github.com/noderun/noderun/systemd"
)

func resetCommand() *cli.Command {
	return &cli.Command{
		Name:  "reset",
		Usage: "stop every pod and remove what noderun set up on this host (stop the daemon first)",
		Description: "Removes containers, networks, its CNI config and bridge, cgroups, state, run and log dirs, a managed containerd,\n" +
			"and the logind drop-in of graceful node shutdown.\n" +
			"Takes the daemon's flags, to find its directories. See docs/operating.md, Reset.",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "force", Usage: "reset even while a noderun daemon holds the directories (it may start pods again), or when they hold files noderun did not make (those are kept)"},
			&cli.BoolFlag{Name: "images", Usage: "also remove the images in noderun's containerd namespace, and the namespace"},
			&cli.DurationFlag{Name: "timeout", Value: 10 * time.Minute, Usage: "give up on pods not gone by then (grace periods are honoured meanwhile)"},
		},
		Action: func(c *cli.Context) error {
			log, err := newLogger(c)
			if err != nil {
				return err
			}
			return reset(c, log, os.Stdout)
		},
	}
}

// reset undoes what noderun did, in the order that lets each step find what
// it needs: pods first (their teardown reads the state and run dirs and
// CNI's cache), then containerd's namespace, the default network, the
// managed daemon, and the directories last. It reads the flags as run
// does (hostConfigFrom) and removes what the layout names.
func reset(c *cli.Context, log *slog.Logger, out io.Writer) error {
	cfg, err := hostConfigFrom(c, log, false)
	if err != nil {
		return err
	}
	cfg.cni.NoDefault = true
	l := cfg.layout
	// Before anything is stopped: a misconfigured dir is found out first.
	if err := l.CheckOwned(c.Bool("force")); err != nil {
		return err
	}
	release, err := l.LockExisting()
	switch {
	case errors.Is(err, layout.ErrLocked) && !c.Bool("force"):
		return fmt.Errorf("%w; stop it first (systemctl stop noderun), or pass --force", err)
	case errors.Is(err, layout.ErrLocked):
		log.Warn("resetting under a running noderun (--force)", "err", err)
	case err != nil:
		return err
	default:
		defer release()
	}
	ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
	defer cancel()
	conn, err := daemon.ConnectForReset(ctx, cfg.daemon)
	if err != nil {
		return err
	}
	var kept []string
	if conn != nil {
		defer conn.Client.Close()
		if kept, err = resetPods(ctx, cfg, conn, c.Bool("images")); err != nil {
			return err
		}
	}
	removed, k, err := cni.RemoveDefaultNetwork(cfg.cni)
	if err != nil {
		return err
	}
	kept = append(kept, k...)
	for _, r := range removed {
		fmt.Fprintln(out, "removed", r)
	}
	if conn != nil {
		if err := conn.StopManaged(ctx); err != nil {
			return err
		}
		if conn.Managed {
			fmt.Fprintln(out, "stopped the managed containerd and removed its directories")
		}
	}
	if path, err := systemd.RemoveLogindDropIn(""); err != nil {
		return err
	} else if path != "" {
		fmt.Fprintln(out, "removed", path)
	}
	k, err = l.RemoveDirs(out)
	if err != nil {
		return err
	}
	for _, why := range append(kept, k...) {
		fmt.Fprintln(out, "kept", why)
	}
	return nil
}

// resetPods removes every pod through the engine's own teardown, then what
// noderun keeps in containerd.
func resetPods(ctx context.Context, cfg hostConfig, conn *daemon.Conn, images bool) (kept []string, err error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	rt := newRuntime(cfg, conn, exe)
	net, err := newSandboxes(cfg, nil, nil) // RemoveDirs unpins the namespace holder
	if err != nil {
		return nil, err
	}
	engine := runner.New(runner.Config{
		NodeName: cfg.nodeName, StateDir: cfg.layout.State, RunDir: cfg.layout.Run,
		PodLogDir: cfg.layout.PodLogs, Logger: cfg.log, Cgroups: cfg.cgroups,
	}, rt, net)
	if err := engine.RemoveAll(ctx); err != nil {
		return nil, err
	}
	kept, err = rt.Reset(ctx, images)
	if err != nil {
		return nil, err
	}
	if !images {
		kept = append(kept, "the images in containerd namespace "+cfg.namespace+" (--images removes them)")
	}
	return kept, nil
}
