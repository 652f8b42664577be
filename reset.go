package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/noderun/noderun/cni"
	"github.com/noderun/noderun/internal/cgroups"
	"github.com/noderun/noderun/runner"
	ctrdrt "github.com/noderun/noderun/runner/containerd"
)

// stateInputs are what an admin puts in the state dir for noderun to read
// (image tarballs, Localhost seccomp profiles, registry credentials): reset
// keeps them, as it keeps the manifests.
var stateInputs = []string{"images", "seccomp", "config.json"}

func resetCommand() *cli.Command {
	return &cli.Command{
		Name:  "reset",
		Usage: "stop every pod and remove what noderun set up on this host (stop the daemon first)",
		Description: "Removes containers, networks, its CNI config and bridge, cgroups, state, run and log dirs, a managed containerd.\n" +
			"Takes the daemon's flags, to find its directories. See docs/operating.md, Reset.",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "force", Usage: "reset even while a noderun daemon holds the directories (it may start pods again)"},
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
// managed daemon, and the directories last.
func reset(c *cli.Context, log *slog.Logger, out io.Writer) error {
	stateDir, runDir, logDir := c.String("state-dir"), c.String("run-dir"), c.String("pod-log-dir")
	cg, err := cgroupLayout(c)
	if err != nil {
		return err
	}
	release, err := lockExisting(stateDir, runDir)
	switch {
	case errors.Is(err, errLocked) && !c.Bool("force"):
		return fmt.Errorf("%w; stop it first (systemctl stop noderun), or pass --force", err)
	case errors.Is(err, errLocked):
		log.Warn("resetting under a running noderun (--force)", "err", err)
	case err != nil:
		return err
	default:
		defer release()
	}
	ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
	defer cancel()
	var kept []string
	netCfg := cni.Config{
		ConfDir: c.String("cni-conf-dir"), BinDirs: filepath.SplitList(c.String("cni-bin-dir")),
		CacheDir: filepath.Join(stateDir, "cni", "cache"), NoDefault: true, Logger: log,
	}
	conn, err := ctrdrt.ConnectForReset(ctx, daemonConfig(c, log))
	if err != nil {
		return err
	}
	if conn != nil {
		defer conn.Client.Close()
		k, err := resetPods(ctx, c, conn, netCfg, cg, log)
		if err != nil {
			return err
		}
		kept = append(kept, k...)
	}
	removed, k, err := cni.RemoveDefaultNetwork(netCfg)
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
	k, err = removeDirs(stateDir, runDir, logDir, statusSocket(c), out)
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
func resetPods(ctx context.Context, c *cli.Context, conn *ctrdrt.Conn, netCfg cni.Config, cg cgroups.Layout, log *slog.Logger) (kept []string, err error) {
	stateDir, runDir := c.String("state-dir"), c.String("run-dir")
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	rt := ctrdrt.New(conn.Client, c.String("containerd-namespace"), filepath.Join(runDir, "runc"), exe,
		ctrdrt.WithSnapshotter(snapshotter), ctrdrt.WithLogger(log), ctrdrt.WithCgroups(cg))
	cniMgr, err := cni.New(netCfg)
	if err != nil {
		return nil, err
	}
	engine := runner.New(runner.Config{
		NodeName: c.String("node-name"), StateDir: stateDir, RunDir: runDir,
		PodLogDir: c.String("pod-log-dir"), Logger: log, Cgroups: cg,
	}, rt, newNetwork(cniMgr, filepath.Join(runDir, "pods"), nil, nil, log)) // removeDirs unpins the namespace holder
	if err := engine.RemoveAll(ctx); err != nil {
		return nil, err
	}
	kept, err = rt.Reset(ctx, c.Bool("images"))
	if err != nil {
		return nil, err
	}
	if !c.Bool("images") {
		kept = append(kept, "the images in containerd namespace "+c.String("containerd-namespace")+" (--images removes them)")
	}
	return kept, nil
}

// lockExisting takes the single-instance lock of those dirs that exist:
// reset creates none of them.
func lockExisting(dirs ...string) (release func(), err error) {
	var have []string
	for _, d := range dirs {
		if _, err := os.Stat(d); err == nil {
			have = append(have, d)
		}
	}
	return lockDirs(have...)
}

// removeDirs removes the run dir, the state dir but for the admin's inputs
// in it, the pod log dir if nothing else logs there, and a status socket
// kept elsewhere; mounts beneath are detached first.
func removeDirs(stateDir, runDir, logDir, socket string, out io.Writer) (kept []string, err error) {
	var errs []error
	if err := runner.RemoveTree(runDir); err != nil {
		errs = append(errs, err)
	}
	ents, err := os.ReadDir(stateDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	for _, e := range ents {
		p := filepath.Join(stateDir, e.Name())
		if slices.Contains(stateInputs, e.Name()) && !isEmpty(p) {
			kept = append(kept, p+": put there for noderun to read")
			continue
		}
		errs = append(errs, runner.RemoveTree(p))
	}
	if len(kept) == 0 {
		errs = append(errs, ignoreMissing(os.Remove(stateDir)))
	}
	// Other runtimes may log there (the kubelet's /var/log/pods): only
	// noderun's pods' dirs went, with the pods.
	if err := os.Remove(logDir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		kept = append(kept, logDir+": other logs in it")
	}
	if st, err := os.Lstat(socket); err == nil && st.Mode()&fs.ModeSocket != 0 {
		errs = append(errs, os.Remove(socket))
	}
	if err := errors.Join(errs...); err != nil {
		return kept, err
	}
	fmt.Fprintln(out, "removed", runDir, "and", stateDir)
	return kept, nil
}

// isEmpty is true for an empty directory and for a missing or empty file.
func isEmpty(p string) bool {
	st, err := os.Stat(p)
	if err != nil {
		return true
	}
	if !st.IsDir() {
		return st.Size() == 0
	}
	ents, err := os.ReadDir(p)
	return err == nil && len(ents) == 0
}

func ignoreMissing(err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}
