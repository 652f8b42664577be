package crilog

import (
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Rotation is the kubelet's containerLogMaxSize and containerLogMaxFiles:
// once the log reaches MaxSize it is renamed to <log>.<timestamp> and a new
// one started; the rotated files but the newest are gzipped, and only
// MaxFiles files (the current one included) are kept. A zero MaxSize
// never rotates.
type Rotation struct {
	MaxSize  int64
	MaxFiles int
}

// rotatedTime is the kubelet's suffix format for rotated logs.
const rotatedTime = "20060102-150405"

// Target is what a log driver is told: the log file, its rotation, and
// the collector's socket ("": drive the log in the driver's own process).
type Target struct {
	Path      string
	Rotation  Rotation
	Collector string
	// Root is the pod log dir: no link below it is followed, since pods
	// with a hostPath there can plant them. "": the log's own directory.
	Root string
}

// Arg encodes t as the log driver's single argument: the path alone,
// "<max size>:<max files>:<path>" with rotation, or a query string
// (collector=..&path=..&max-size=..&max-files=..&root=..) with a collector
// or a root.
func (t Target) Arg() string {
	if t.Collector != "" || t.Root != "" {
		q := url.Values{
			"collector": {t.Collector}, "path": {t.Path},
			"max-size": {strconv.FormatInt(t.Rotation.MaxSize, 10)}, "max-files": {strconv.Itoa(t.Rotation.MaxFiles)},
		}
		if t.Root != "" {
			q.Set("root", t.Root)
		}
		return q.Encode()
	}
	if t.Rotation.MaxSize <= 0 {
		return t.Path
	}
	return fmt.Sprintf("%d:%d:%s", t.Rotation.MaxSize, t.Rotation.MaxFiles, t.Path)
}

// ParseArg reads what Arg wrote.
func ParseArg(arg string) (Target, error) {
	if strings.HasPrefix(arg, "collector=") {
		q, err := url.ParseQuery(arg)
		if err != nil {
			return Target{}, fmt.Errorf("crilog: bad argument %q: %w", arg, err)
		}
		t := Target{Path: q.Get("path"), Collector: q.Get("collector"), Root: q.Get("root")}
		size, err1 := strconv.ParseInt(q.Get("max-size"), 10, 64)
		files, err2 := strconv.Atoi(q.Get("max-files"))
		if err1 != nil || err2 != nil || size < 0 || (size > 0 && files < 2) || !filepath.IsAbs(t.Path) ||
			(t.Collector == "" && t.Root == "") || (t.Collector != "" && !filepath.IsAbs(t.Collector)) ||
			(t.Root != "" && !below(t.Root, t.Path)) {
			return Target{}, fmt.Errorf("crilog: bad argument %q", arg)
		}
		if size > 0 {
			t.Rotation = Rotation{MaxSize: size, MaxFiles: files}
		}
		return t, nil
	}
	if strings.HasPrefix(arg, "/") || !strings.Contains(arg, ":") {
		return Target{Path: arg}, nil
	}
	parts := strings.SplitN(arg, ":", 3)
	if len(parts) != 3 {
		return Target{}, fmt.Errorf("crilog: bad argument %q", arg)
	}
	size, err1 := strconv.ParseInt(parts[0], 10, 64)
	files, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil || size <= 0 || files < 2 {
		return Target{}, fmt.Errorf("crilog: bad rotation in argument %q", arg)
	}
	return Target{Path: parts[2], Rotation: Rotation{MaxSize: size, MaxFiles: files}}, nil
}

// rotator renames and compresses a log file as it grows; it is driven by
// the recordWriter, under its lock, so no record is split across files.
// It works in the log's directory, opened anew for each rotation without
// following links below root (see openDirBelow).
type rotator struct {
	path   string
	root   string
	r      Rotation
	size   int64
	now    func() time.Time
	report func(error)
	gz     sync.Mutex // one compression at a time, off the copy path
	// create makes the new log; tests make it fail.
	create func(dir *os.File, name string) (*os.File, error)
	// failing is set while rotations fail, so that only the first failure
	// and the recovery are reported; retryAt is when to try again.
	failing bool
	retryAt time.Time
}

// rotateRetry is how long a failed rotation waits before the next try:
// the log grows past MaxSize meanwhile, so it is tried again soon, but
// not at every record of a busy container.
const rotateRetry = time.Second

// due reports whether the log is to be rotated now.
func (rt *rotator) due() bool {
	return rt.size >= rt.r.MaxSize && !rt.now().Before(rt.retryAt)
}

// rotate moves the full log aside and returns the new one to write to. On
// a failure it reports it, leaves the log under its name, and goes on
// writing to f until the next try: a log moved aside with no new one made
// (no free inode, a quota) would be written to for good, under a name no
// reader follows and that no later rotation renames.
func (rt *rotator) rotate(f *os.File) *os.File {
	dir, err := openDirBelow(rt.root, filepath.Dir(rt.path), false)
	if err != nil {
		rt.failed(err)
		return f
	}
	defer dir.Close()
	name := filepath.Base(rt.path)
	aside := rt.asideName(dir, rt.now().Format(rotatedTime))
	if err := unix.Renameat(int(dir.Fd()), name, int(dir.Fd()), aside); err != nil {
		rt.failed(&os.LinkError{Op: "rename", Old: rt.path, New: aside, Err: err})
		return f
	}
	nf, err := rt.create(dir, name)
	if err != nil {
		// Put it back; nothing can have taken the name (the log's
		// writer is this one), but never replace what did.
		if rerr := unix.Renameat2(int(dir.Fd()), aside, int(dir.Fd()), name, unix.RENAME_NOREPLACE); rerr != nil {
			err = fmt.Errorf("%w; and moving %s back: %w", err, aside, rerr)
		}
		rt.failed(err)
		return f
	}
	f.Close()
	rt.size = 0
	if rt.failing {
		rt.failing = false
		rt.report(errors.New("crilog: rotating again"))
	}
	go rt.tidy()
	return nf
}

// failed reports the first of a run of failed rotations.
func (rt *rotator) failed(err error) {
	rt.retryAt = rt.now().Add(rotateRetry)
	if !rt.failing {
		rt.failing = true
		rt.report(fmt.Errorf("crilog: rotate: %w; the log grows past its maximum size until a rotation works", err))
	}
}

// createLog opens the log name in dir for appending, creating it.
func createLog(dir *os.File, name string) (*os.File, error) {
	return openIn(dir, name, unix.O_WRONLY|unix.O_CREAT|unix.O_APPEND, 0o640)
}

// asideName is the name for the full log: the kubelet's, with a counter
// (padded, so names sort in time order) when the second already had a
// rotation. The counter follows the highest one left, not the first free
// one: tidy may have removed the second's oldest file, and a new file
// taking its name would sort as the oldest.
func (rt *rotator) asideName(dir *os.File, stamp string) string {
	base := filepath.Base(rt.path) + "." + stamp
	names, _ := namesIn(dir)
	next := 0
	for _, m := range names {
		if !strings.HasPrefix(m, base) {
			continue
		}
		rest, _, _ := strings.Cut(strings.TrimPrefix(m, base), ".") // .gz, .gz.tmp
		n := 0
		if rest != "" {
			var err error
			if n, err = strconv.Atoi(strings.TrimPrefix(rest, "-")); err != nil {
				continue
			}
		}
		next = max(next, n+1)
	}
	if next == 0 {
		return base
	}
	return fmt.Sprintf("%s-%03d", base, next)
}

// tidy gzips the rotated files but the newest, which a reader may still
// follow, and removes the oldest past MaxFiles.
func (rt *rotator) tidy() {
	rt.gz.Lock()
	defer rt.gz.Unlock()
	dir, err := openDirBelow(rt.root, filepath.Dir(rt.path), false)
	if err != nil {
		rt.report(fmt.Errorf("crilog: rotate: %w", err))
		return
	}
	defer dir.Close()
	d := int(dir.Fd())
	name := filepath.Base(rt.path)
	names, _ := namesIn(dir)
	for _, n := range names {
		if strings.HasPrefix(n, name+".") && strings.HasSuffix(n, ".tmp") {
			_ = unix.Unlinkat(d, n, 0) // a compression cut short
		}
	}
	rotated := rotatedNames(dir, name)
	for i, p := range rotated {
		if i == len(rotated)-1 || strings.HasSuffix(p, ".gz") {
			continue
		}
		gzp, err := compress(dir, p)
		if err != nil {
			rt.report(err)
			continue
		}
		rotated[i] = gzp
	}
	for len(rotated) > rt.r.MaxFiles-1 {
		_ = unix.Unlinkat(d, rotated[0], 0)
		rotated = rotated[1:]
	}
}

// compress gzips p in dir into p.gz (through p.gz.tmp, so a crash leaves
// no half file under the final name) and removes p.
func compress(dir *os.File, p string) (string, error) {
	d := int(dir.Fd())
	in, err := openIn(dir, p, unix.O_RDONLY, 0)
	if err != nil {
		return "", fmt.Errorf("crilog: compress: %w", err)
	}
	defer in.Close()
	tmp := p + ".gz.tmp"
	// O_EXCL: tidy removed what a crash left, and anything there now was
	// planted.
	out, err := openIn(dir, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o640)
	if err != nil {
		return "", fmt.Errorf("crilog: compress: %w", err)
	}
	zw := gzip.NewWriter(out)
	_, err = io.Copy(zw, in)
	if cerr := zw.Close(); err == nil {
		err = cerr
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(d, tmp, d, p+".gz")
	}
	if err != nil {
		_ = unix.Unlinkat(d, tmp, 0)
		return "", fmt.Errorf("crilog: compress %s: %w", filepath.Join(dir.Name(), p), err)
	}
	_ = unix.Unlinkat(d, p, 0)
	return p + ".gz", nil
}
