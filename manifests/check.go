package manifests

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
)

// CheckPath reads a manifest file or directory once, as a FileSource with
// opts would, and returns what it would run: pods, errors and info. A missing path is an
// error here, where a source would wait for it to appear.
func CheckPath(path, nodeName string, opts ...FileOption) Snapshot {
	r := &fileRun{FileSource: NewFileSource(path, nodeName, opts...), files: map[string]*fileResult{}, readAsIs: true}
	if _, err := os.Stat(r.path); err != nil {
		return failedCheck(r.source, &ManifestError{File: path, Err: err})
	}
	if _, err := r.manifestPaths(); err != nil {
		return failedCheck(r.source, &ManifestError{File: path, Err: err})
	}
	r.relistAll()
	snap, _ := r.snapshot()
	asGiven(&snap, r.path, path)
	return snap
}

// asGiven names files in errors and pod info by the path as given, as a
// compiler does, rather than by the absolute path a source uses.
func asGiven(snap *Snapshot, abs, given string) {
	rename := func(file string) string {
		if rel, ok := strings.CutPrefix(file, abs); ok {
			return filepath.Clean(given + rel)
		}
		return file
	}
	snap.Info.Errors, snap.Info.Warnings = nil, nil
	for _, err := range snap.Errors {
		var me *ManifestError
		if errors.As(err, &me) {
			me.File = rename(me.File)
		}
		snap.Info.Errors = append(snap.Info.Errors, err.Error())
	}
	for _, w := range snap.Warnings {
		var me *ManifestError
		if errors.As(w, &me) {
			me.File = rename(me.File)
		}
		snap.Info.Warnings = append(snap.Info.Warnings, w.Error())
	}
	for i := range snap.Info.Pods {
		snap.Info.Pods[i].File = rename(snap.Info.Pods[i].File)
	}
}

// CheckURL fetches a URL once, as a URLSource would, and returns what it
// would run. opts are those of NewURLSource.
func CheckURL(ctx context.Context, rawURL, nodeName string, opts ...URLOption) Snapshot {
	s, err := NewURLSource(rawURL, nodeName, opts...)
	if err != nil {
		return failedCheck("http:", err) // err names the URL, without credentials
	}
	r := &urlRun{URLSource: s}
	r.poll(ctx)
	snap, _ := r.snapshot()
	return snap
}

func failedCheck(source string, err error) Snapshot {
	snap, _ := assemble(source, nil, map[string]*fileResult{}, err)
	return snap
}
