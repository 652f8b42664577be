package nodelog

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"time"
)

// DefaultDir is the kubelet's node log directory.
const DefaultDir = "/var/log"

// queryTimeout bounds one query's journalctl runs and file copies, as the
// kubelet's 30 s deadline does; a client that goes away ends it sooner.
const queryTimeout = 30 * time.Second

// Server answers the kubelet's /logs/ requests: a query (?query=...) or,
// without one, the file or directory listing at the path under the log
// directory. Nothing outside the directory is reached: files are opened
// through an os.Root, which refuses "..", and symlinks, leading out.
type Server struct {
	dir        string
	journalctl []string
}

// Option sets an optional setting of New.
type Option func(*Server)

// WithJournalctl sets the journal reader's command and its first
// arguments (the default: journalctl), so that a test reads a journal
// directory of its own (journalctl --directory=DIR).
func WithJournalctl(cmd ...string) Option { return func(s *Server) { s.journalctl = cmd } }

// New returns a Server for the log directory dir (DefaultDir on a node).
func New(dir string, opts ...Option) *Server {
	s := &Server{dir: dir, journalctl: []string{"journalctl"}}
	for _, o := range opts {
		o(s)
	}
	return s
}

// ServeHTTP serves r, whose URL path is the part after /logs (the caller
// strips the route), as the kubelet does with enableSystemLogQuery: query
// errors are a 400, invalid queries a 406, with the kubelet's texts.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n, errs := Parse(r.URL.Query())
	if len(errs) > 0 {
		http.Error(w, errs.ToAggregate().Error(), http.StatusBadRequest)
		return
	}
	root, err := os.OpenRoot(s.dir)
	if err != nil {
		http.Error(w, "node logs: "+err.Error(), http.StatusNotFound)
		return
	}
	defer root.Close()
	if n != nil {
		if r.URL.Path != "/" && r.URL.Path != "" {
			http.Error(w, "path not allowed in query mode", http.StatusNotAcceptable)
			return
		}
		stat := func(name string) error { _, err := root.Stat(inRoot(name)); return err }
		if errs := n.Validate(stat); len(errs) > 0 {
			http.Error(w, errs.ToAggregate().Error(), http.StatusNotAcceptable)
			return
		}
		if len(n.Services) > 0 {
			s.serveServices(w, r, root, n)
			return
		}
		r = r.Clone(r.Context())
		r.URL.Path, r.URL.RawPath = "/"+inRoot(n.Files[0]), ""
	} else if _, err := root.Stat(inRoot(r.URL.Path)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		// A symlink leading out: the file server would call it a 500.
		http.Error(w, err.Error(), http.StatusForbidden)
		return
	}
	// http.FileServerFS streams a file (ServeContent: ranges, no buffering)
	// and lists a directory, as the kubelet's http.FileServer does.
	http.FileServerFS(root.FS()).ServeHTTP(w, r)
}

// inRoot is a query's file name relative to the log directory: a leading
// / names the directory itself, as the kubelet's securejoin reads it.
func inRoot(name string) string {
	name = strings.TrimPrefix(path.Clean("/"+filepath.ToSlash(name)), "/")
	if name == "" {
		return "."
	}
	return name
}

// serveServices writes the services' logs: from the journal for those it
// holds, else from the files the kubelet's heuristics look for.
func (s *Server) serveServices(w http.ResponseWriter, r *http.Request, root *os.Root, n *Query) {
	ctx, cancel := context.WithTimeout(r.Context(), queryTimeout)
	defer cancel()
	w.Header().Set("Content-Type", "text/plain;charset=UTF-8")
	var out io.Writer = w
	if r.Header.Get("Accept-Encoding") == "gzip" {
		w.Header().Set("Content-Encoding", "gzip")
		gz, _ := gzip.NewWriterLevel(w, gzip.BestSpeed) // a valid level: no error
		defer gz.Close()
		out = gz
	}
	units := s.journalUnits(ctx)
	var journal, files []string
	for _, svc := range n.Services {
		if strings.Contains(units, svc+".service") {
			journal = append(journal, svc)
		} else {
			files = append(files, svc)
		}
	}
	if len(journal) > 0 {
		s.copyJournal(ctx, out, n, journal)
	}
	if len(files) > 0 && n.Options != (Options{}) {
		fmt.Fprintf(out, "\noptions present and query resolved to log files for %v\ntry without specifying options\n", files)
		return
	}
	for _, svc := range files {
		if ctx.Err() != nil {
			fmt.Fprintf(out, "\ncontext error: %v\n", ctx.Err())
			return
		}
		copyServiceFile(ctx, out, root, svc)
	}
}

// journalUnits is journalctl's list of the units it holds entries of ("":
// no journal, as on a host without systemd or journalctl). The kubelet
// asks the same to tell a journal unit from a service logging to a file.
func (s *Server) journalUnits(ctx context.Context) string {
	args := append(append([]string(nil), s.journalctl[1:]...), "--field", "_SYSTEMD_UNIT")
	b, err := exec.CommandContext(ctx, s.journalctl[0], args...).Output()
	if err != nil {
		return ""
	}
	return string(b)
}

// copyJournal streams journalctl's output for units: it is killed when
// ctx ends (the client went away, or the deadline passed).
func (s *Server) copyJournal(ctx context.Context, w io.Writer, n *Query, units []string) {
	args := append(append([]string(nil), s.journalctl[1:]...), n.JournalArgs(units)...)
	cmd := exec.CommandContext(ctx, s.journalctl[0], args...)
	cmd.Stdout, cmd.Stderr = w, w
	cmd.WaitDelay = time.Second // a killed journalctl's pipe is not waited on longer
	if err := cmd.Run(); err != nil {
		var exit *exec.ExitError
		if !errors.As(err, &exit) && (n.Boot == nil || *n.Boot == 0) {
			fmt.Fprintf(w, "\nerror: journal output not available\n")
		}
	}
}

// copyServiceFile writes the first of the kubelet's candidates for a
// service's log file: <svc>, <svc>.log, <svc>/<svc>.log.
func copyServiceFile(ctx context.Context, w io.Writer, root *os.Root, svc string) {
	var err error
	for _, name := range []string{svc, svc + ".log", svc + "/" + svc + ".log"} {
		if err = copyFile(ctx, w, root, name); !errors.Is(err, fs.ErrNotExist) {
			break
		}
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		fmt.Fprintf(w, "\nlog not found for %s\n", svc)
	case err != nil:
		fmt.Fprintf(w, "\nerror getting log for %s: %v\n", svc, err)
	}
}

// copyFile streams one file under root; a directory counts as missing.
func copyFile(ctx context.Context, w io.Writer, root *os.Root, name string) error {
	f, err := root.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil {
		return err
	} else if fi.IsDir() {
		return fs.ErrNotExist
	}
	_, err = io.Copy(w, ctxReader{ctx, f})
	return err
}

// ctxReader stops a copy once its context ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
