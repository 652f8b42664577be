// Package atomicfile writes small state files so that after a crash or a
// power cut a reader finds either the old content or the new, never an
// empty or half-written file: a temporary file in the same directory is
// written and fsynced, renamed over the target, and the directory fsynced
// so the rename itself survives. (renameio, the usual library, leaves the
// directory unsynced: after a power cut the old name may come back.)
package atomicfile

import (
	"os"
	"path/filepath"
)

// WriteFile atomically replaces path, in an existing directory, with data;
// mode is the new file's permission.
func WriteFile(path string, data []byte, mode os.FileMode) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if _, err = f.Write(data); err != nil {
		return err
	}
	if err = f.Chmod(mode); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(f.Name(), path); err != nil {
		return err
	}
	return syncDir(dir)
}

// Touch creates path, in an existing directory, as an empty file if it is
// not there, and makes it durable: an empty file is whole as soon as it
// exists, so it needs no temporary file and rename, only the fsyncs.
func Touch(path string, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return syncDir(filepath.Dir(path))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
