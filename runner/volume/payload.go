package volume

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// PayloadFile is one file of an API-data volume (downwardAPI).
type PayloadFile struct {
	Data []byte
	Mode uint32 // permission bits
}

// dataLink is the symlink that names the current generation, as in the
// kubelet's AtomicWriter: readers see either the old or the new files.
const dataLink = "..data"

// WritePayload publishes payload (relative path → file) in dir the way the
// kubelet's AtomicWriter does: a new "..<timestamp>" generation directory
// is filled, then the "..data" link is renamed over, and every top-level
// name is a link "name -> ..data/name". Nothing is ever opened, written or
// chmodded through an existing entry, so links planted in dir lead nowhere.
// gid, when not -1, owns the files (fsGroup). An unchanged payload is left
// alone.
func WritePayload(dir string, payload map[string]PayloadFile, gid int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(dfd)
	cur := currentGeneration(dfd)
	if cur != "" && generationHolds(dfd, cur, payload, gid) {
		return ensureUserLinks(dfd, payload)
	}
	gen := ".." + time.Now().UTC().Format("2006_01_02_15_04_05.000000000")
	if err := writeGeneration(dfd, gen, payload, gid); err != nil {
		return err
	}
	tmp := dataLink + "_tmp"
	_ = unix.Unlinkat(dfd, tmp, 0)
	if err := unix.Symlinkat(gen, dfd, tmp); err != nil {
		return fmt.Errorf("%s: link %s: %w", dir, tmp, err)
	}
	if err := unix.Renameat(dfd, tmp, dfd, dataLink); err != nil {
		return fmt.Errorf("%s: swap %s: %w", dir, dataLink, err)
	}
	if err := ensureUserLinks(dfd, payload); err != nil {
		return err
	}
	return removeStale(dir, dfd, gen, payload)
}

// currentGeneration is the generation ..data names, if it is one.
func currentGeneration(dfd int) string {
	buf := make([]byte, 256)
	n, err := unix.Readlinkat(dfd, dataLink, buf)
	if err != nil {
		return ""
	}
	gen := string(buf[:n])
	if !strings.HasPrefix(gen, "..") || strings.Contains(gen, "/") || gen == ".." {
		return ""
	}
	return gen
}

// generationHolds reports whether gen already has exactly payload's
// content, modes and group, reading without following any link.
func generationHolds(dfd int, gen string, payload map[string]PayloadFile, gid int) bool {
	for rel, f := range payload {
		fd, err := openat2(dfd, gen+"/"+rel, &unix.OpenHow{
			Flags:   unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NOFOLLOW,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS,
		})
		if err != nil {
			return false
		}
		file := os.NewFile(uintptr(fd), rel)
		var st unix.Stat_t
		err = unix.Fstat(fd, &st)
		data, rerr := io.ReadAll(io.LimitReader(file, int64(len(f.Data))+1))
		file.Close()
		if err != nil || rerr != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Mode&0o7777 != f.Mode ||
			(gid != -1 && int(st.Gid) != gid) || !bytes.Equal(data, f.Data) {
			return false
		}
	}
	return true
}

// writeGeneration creates gen with every payload file, each created anew
// (O_EXCL, O_NOFOLLOW) in directories it made itself.
func writeGeneration(dfd int, gen string, payload map[string]PayloadFile, gid int) error {
	if err := unix.Mkdirat(dfd, gen, 0o755); err != nil {
		return fmt.Errorf("mkdir %s: %w", gen, err)
	}
	for _, rel := range slices.Sorted(maps.Keys(payload)) {
		f := payload[rel]
		parent := filepath.Dir(gen + "/" + rel)
		for _, d := range ancestors(gen, parent) {
			if err := unix.Mkdirat(dfd, d, 0o755); err != nil && err != unix.EEXIST {
				return fmt.Errorf("mkdir %s: %w", d, err)
			}
		}
		fd, err := openat2(dfd, gen+"/"+rel, &unix.OpenHow{
			Flags:   unix.O_WRONLY | unix.O_CREAT | unix.O_EXCL | unix.O_NOFOLLOW | unix.O_CLOEXEC,
			Mode:    0o600,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS,
		})
		if err != nil {
			return fmt.Errorf("create %s: %w", rel, err)
		}
		file := os.NewFile(uintptr(fd), rel)
		_, err = file.Write(f.Data)
		if err == nil && gid != -1 {
			err = file.Chown(-1, gid)
		}
		if err == nil {
			err = unix.Fchmod(fd, f.Mode)
		}
		if cerr := file.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("write %s: %w", rel, err)
		}
	}
	return nil
}

// ancestors lists the directories from below gen down to dir, in order.
func ancestors(gen, dir string) []string {
	var out []string
	for d := dir; d != gen && d != "." && d != "/"; d = filepath.Dir(d) {
		out = append([]string{d}, out...)
	}
	return out
}

// ensureUserLinks makes each top-level payload name a link into ..data,
// replacing whatever else sits there.
func ensureUserLinks(dfd int, payload map[string]PayloadFile) error {
	for _, top := range topNames(payload) {
		want := dataLink + "/" + top
		buf := make([]byte, len(want)+1)
		if n, err := unix.Readlinkat(dfd, top, buf); err == nil && string(buf[:n]) == want {
			continue
		}
		if err := removeAt(dfd, top); err != nil {
			return err
		}
		if err := unix.Symlinkat(want, dfd, top); err != nil {
			return fmt.Errorf("link %s: %w", top, err)
		}
	}
	return nil
}

// removeAt removes an entry of dfd, a whole tree if it is a directory,
// without following links (os.RemoveAll works on names, not targets).
func removeAt(dfd int, name string) error {
	err := unix.Unlinkat(dfd, name, 0)
	if err == nil || err == unix.ENOENT {
		return nil
	}
	if err != unix.EISDIR {
		return fmt.Errorf("remove %s: %w", name, err)
	}
	return os.RemoveAll(fmt.Sprintf("/proc/self/fd/%d/%s", dfd, name))
}

// removeStale removes older generations and names no longer published.
func removeStale(dir string, dfd int, gen string, payload map[string]PayloadFile) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	keep := map[string]bool{gen: true, dataLink: true}
	for _, top := range topNames(payload) {
		keep[top] = true
	}
	var errs []error
	for _, e := range ents {
		if !keep[e.Name()] {
			errs = append(errs, removeAt(dfd, e.Name()))
		}
	}
	return errors.Join(errs...)
}

func topNames(payload map[string]PayloadFile) []string {
	var out []string
	for rel := range payload {
		top, _, _ := strings.Cut(rel, "/")
		if !slices.Contains(out, top) {
			out = append(out, top)
		}
	}
	slices.Sort(out)
	return out
}
