package layout

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/noderun/noderun/runner/volume"
)

// CheckOwned refuses, unless force, a state or run dir that holds what
// noderun does not make there: a flag naming another program's directory.
func (l Layout) CheckOwned(force bool) error {
	for _, d := range []struct {
		flag, dir string
		names     []string
	}{{"state-dir", l.State, slices.Concat(stateOwned, stateInputs)}, {"run-dir", l.Run, runOwned}} {
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

// RemoveDirs removes what noderun made in the run dir and the state dir
// but for the admin's inputs, then each dir if nothing else is left in it;
// the pod log dir if nothing else logs there, and a status socket kept
// elsewhere. Mounts below what it removes (noderun's) are detached first;
// it never unmounts anything else.
func (l Layout) RemoveDirs(out io.Writer) (kept []string, err error) {
	var errs []error
	k, err := removeOwned(l.Run, runOwned, nil)
	errs = append(errs, err)
	kept = append(kept, k...)
	k, err = removeOwned(l.State, stateOwned, stateInputs)
	errs = append(errs, err)
	kept = append(kept, k...)
	// Other runtimes may log there (the kubelet's /var/log/pods): only
	// noderun's pods' dirs went, with the pods.
	if err := os.Remove(l.PodLogs); err != nil && !errors.Is(err, fs.ErrNotExist) {
		kept = append(kept, l.PodLogs+": other logs in it")
	}
	if st, err := os.Lstat(l.Socket); err == nil && st.Mode()&fs.ModeSocket != 0 {
		errs = append(errs, os.Remove(l.Socket))
	}
	if err := errors.Join(errs...); err != nil {
		return kept, err
	}
	fmt.Fprintln(out, "removed", l.Run, "and", l.State)
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
