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
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/noderun/noderun/cni"
	"github.com/noderun/noderun/runner"
	"github.com/noderun/noderun/runner/containerd/daemon"
	"github.com/noderun/noderun/runner/volume"
)

func resetCommand() *cli.Command {
	return &cli.Command{
		Name:  "reset",
		Usage: "stop every pod and remove what noderun set up on this host (stop the daemon first)",
		Description: "Removes containers, networks, its CNI config and bridge, cgroups, state, run and log dirs, a managed containerd.\n" +
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
	if err := checkOwned(l, c.Bool("force")); err != nil {
		return err
	}
	release, err := lockExisting(l.state, l.run)
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
	k, err = removeDirs(l, out)
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
	net, err := newSandboxes(cfg, nil, nil) // removeDirs unpins the namespace holder
	if err != nil {
		return nil, err
	}
	engine := runner.New(runner.Config{
		NodeName: cfg.nodeName, StateDir: cfg.layout.state, RunDir: cfg.layout.run,
		PodLogDir: cfg.layout.podLogs, Logger: cfg.log, Cgroups: cfg.cgroups,
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

// checkOwned refuses, unless force, a state or run dir that holds what
// noderun does not make there: a flag naming another program's directory.
func checkOwned(l layout, force bool) error {
	for _, d := range []struct {
		flag, dir string
		names     []string
	}{{"state-dir", l.state, slices.Concat(stateOwned, stateInputs)}, {"run-dir", l.run, runOwned}} {
		other, err := foreign(d.dir, d.names)
		if err != nil {
			return err
		}
		if len(other) > 0 && !force {
			return fmt.Errorf("--%s %s holds what noderun did not make: %s; reset removes only what noderun makes there, so check the flag, or pass --force to reset and keep those",
				d.flag, d.dir, strings.Join(other, ", "))
		}
	}
	return nil
}

// removeDirs removes what noderun made in the run dir and the state dir
// but for the admin's inputs, then each dir if nothing else is left in it;
// the pod log dir if nothing else logs there, and a status socket kept
// elsewhere. Mounts below what it removes (noderun's) are detached first;
// it never unmounts anything else.
func removeDirs(l layout, out io.Writer) (kept []string, err error) {
	var errs []error
	k, err := removeOwned(l.run, runOwned, nil)
	errs = append(errs, err)
	kept = append(kept, k...)
	k, err = removeOwned(l.state, stateOwned, stateInputs)
	errs = append(errs, err)
	kept = append(kept, k...)
	// Other runtimes may log there (the kubelet's /var/log/pods): only
	// noderun's pods' dirs went, with the pods.
	if err := os.Remove(l.podLogs); err != nil && !errors.Is(err, fs.ErrNotExist) {
		kept = append(kept, l.podLogs+": other logs in it")
	}
	if st, err := os.Lstat(l.socket); err == nil && st.Mode()&fs.ModeSocket != 0 {
		errs = append(errs, os.Remove(l.socket))
	}
	if err := errors.Join(errs...); err != nil {
		return kept, err
	}
	fmt.Fprintln(out, "removed", l.run, "and", l.state)
	return kept, nil
}

// removeOwned removes the entries of dir that are among owned, and those
// among inputs when empty, then dir itself when nothing is left.
func removeOwned(dir string, owned, inputs []string) (kept []string, err error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var errs []error
	var other []string
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		switch {
		case ownedName(e.Name(), owned):
			errs = append(errs, volume.RemoveTree(p))
		case slices.Contains(inputs, e.Name()) && !isEmpty(p):
			kept = append(kept, p+": put there for noderun to read")
		case slices.Contains(inputs, e.Name()):
			errs = append(errs, volume.RemoveTree(p))
		default:
			other = append(other, e.Name())
		}
	}
	if len(other) > 0 {
		kept = append(kept, dir+": not noderun's: "+strings.Join(other, ", "))
	}
	if len(kept) == 0 {
		// A mount point is the admin's (a tmpfs of its own): kept.
		if err := os.Remove(dir); errors.Is(err, unix.EBUSY) {
			kept = append(kept, dir+": a mount point")
		} else {
			errs = append(errs, ignoreMissing(err))
		}
	}
	return kept, errors.Join(errs...)
}

// foreign lists the entries of dir that are not among names: what noderun
// did not make there.
func foreign(dir string, names []string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if !ownedName(e.Name(), names) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// ownedName reports whether name is one of names, or the temporary file of
// one that a crash left while replacing it (atomicfile's .<name>.tmp*, the
// ledger's and the status socket's <name>.tmp).
func ownedName(name string, names []string) bool {
	for _, n := range names {
		if name == n || name == n+".tmp" || strings.HasPrefix(name, "."+n+".tmp") {
			return true
		}
	}
	return false
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
