package cni

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/containernetworking/cni/pkg/utils"

	"github.com/noderun/noderun/internal/atomicfile"
)

// ledger is noderun's durable record of the attachments it may have made:
// an empty file <dir>/<network>/<id>, written before each ADD and removed
// once a DEL of the ID succeeds. host-local's lease dir and the nat table
// may be shared with other runtimes that use the same network, so GC
// releases leases and nat rules only of the IDs recorded here (or in
// libcni's cache, which is noderun's own). The cache alone does not do:
// libcni writes it only after every plugin's ADD succeeded, so a crash mid-ADD
// leaves a lease that only this record shows is noderun's.
type ledger struct{ dir string }

// add records that id may get state in network; the record is on disk when
// it returns, so that it survives a crash during the ADD that follows.
func (l ledger) add(network, id string) error {
	if err := validOwner(network, id); err != nil {
		return fmt.Errorf("cni: record %s: %w", id, err)
	}
	dir := filepath.Join(l.dir, network)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("cni: record %s: %w", id, err)
	}
	if err := atomicfile.Touch(filepath.Join(dir, id), 0o600); err != nil {
		return fmt.Errorf("cni: record %s: %w", id, err)
	}
	return nil
}

// has reports whether id is recorded in any network.
func (l ledger) has(id string) bool {
	nets, err := os.ReadDir(l.dir)
	if err != nil || utils.ValidateContainerID(id) != nil {
		return false
	}
	for _, n := range nets {
		if _, err := os.Stat(filepath.Join(l.dir, n.Name(), id)); err == nil {
			return true
		}
	}
	return false
}

// remove forgets id in every network.
func (l ledger) remove(id string) error {
	if err := utils.ValidateContainerID(id); err != nil {
		return fmt.Errorf("cni: forget %s: %w", id, err)
	}
	nets, err := os.ReadDir(l.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("cni: forget %s: %w", id, err)
	}
	var errs []error
	for _, n := range nets {
		err := os.Remove(filepath.Join(l.dir, n.Name(), id))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cni: forget %s: %w", id, err)
	}
	return nil
}

// owners returns every recorded (network, id).
func (l ledger) owners() (map[natOwner]bool, error) {
	out := map[natOwner]bool{}
	nets, err := os.ReadDir(l.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cni: read %s: %w", l.dir, err)
	}
	for _, n := range nets {
		ids, err := os.ReadDir(filepath.Join(l.dir, n.Name()))
		if err != nil {
			return nil, fmt.Errorf("cni: read %s: %w", l.dir, err)
		}
		for _, id := range ids {
			if validOwner(n.Name(), id.Name()) == nil { // skips atomicfile's temp files
				out[natOwner{n.Name(), id.Name()}] = true
			}
		}
	}
	return out, nil
}

// validOwner accepts the names libcni accepts, which are also safe file
// names (no "/", never "." or "..").
func validOwner(network, id string) error {
	if err := utils.ValidateNetworkName(network); err != nil {
		return err
	}
	if err := utils.ValidateContainerID(id); err != nil {
		return err
	}
	return nil
}
