// Package secretfile opens files that hold secrets (registry credentials,
// a manifest URL's headers) only when group and others cannot access them,
// as ssh does with its keys: a secret others may read is a leaked one, and
// noderun says so rather than use it.
package secretfile

import (
	"errors"
	"fmt"
	"os"
)

// ErrMode is why a file that group or others may access is refused.
var ErrMode = errors.New("is accessible by group or others; chmod 600 it")

// Open opens path for reading once its mode gives group and others no
// access; otherwise it fails with ErrMode, naming the mode but not the
// path, which callers name.
func Open(path string) (*os.File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		f.Close()
		return nil, fmt.Errorf("mode %#o %w", perm, ErrMode)
	}
	return f, nil
}
