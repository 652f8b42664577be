// Package logdriver carries the containers' log driver (./driver) inside
// noderun's binary and installs it where containerd's shim can run it.
//
// The shim runs a binary log driver at every container start and waits for
// it before `runc create`. noderun's own binary took 8 ms of CPU and 10 ms
// of wall time to get there, all of it Go initialising the packages of a
// daemon the driver does not use; the driver alone starts in under 2.
// Built with make (the noderun_logdriver tag, after the driver was built
// and gzipped into bin/), the binary embeds it: 1.2 MiB more binary for a
// 2.9 MiB program. A plain `go build` embeds nothing, and noderun runs
// itself as the driver, which is the same crilog code.
package logdriver

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/noderun/noderun/crilog"
	"github.com/noderun/noderun/internal/atomicfile"
	"github.com/noderun/noderun/internal/memtrim"
)

// checkWait bounds the check, which must not hold noderun's start.
const checkWait = 10 * time.Second

// prefix starts the names of installed drivers; the rest is a hash of the
// content, so a file of that name is never another build's driver.
const prefix = "log-driver-"

// Install puts the embedded driver into dir, removes the drivers other
// builds left there, checks that it runs (dir could be on a noexec mount)
// and returns its path. It returns "" and no error when this binary embeds
// no driver.
func Install(dir string) (string, error) {
	if len(embedded) == 0 {
		return "", nil
	}
	zr, err := gzip.NewReader(bytes.NewReader(embedded))
	if err != nil {
		return "", fmt.Errorf("the embedded log driver: %w", err)
	}
	bin, err := io.ReadAll(zr)
	if err != nil {
		return "", fmt.Errorf("the embedded log driver: %w", err)
	}
	return install(bin, dir)
}

// InstallOrSelf returns the program containerd's shim runs as each
// container's log driver: the small one this binary embeds, put in dir
// (Install), else self, noderun's own binary (built without it, or the
// installed copy does not run).
func InstallOrSelf(log *slog.Logger, dir, self string) string {
	return installOrSelf(log, Install, dir, self)
}

// installOrSelf is InstallOrSelf with the install a test can fake.
func installOrSelf(log *slog.Logger, install func(dir string) (string, error), dir, self string) string {
	path, err := install(dir)
	if err != nil {
		log.Warn("noderun's own binary runs as the containers' log driver", "err", err)
	}
	if path == "" {
		return self
	}
	log.Debug("containers' log driver", "path", path)
	// Reading the embedded copy made those pages of the binary resident.
	memtrim.TrimExecutable()
	return path
}

func install(bin []byte, dir string) (string, error) {
	sum := sha256.Sum256(bin)
	name := prefix + hex.EncodeToString(sum[:8])
	path := filepath.Join(dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("install the log driver: %w", err)
	}
	if have, err := os.ReadFile(path); err != nil || !bytes.Equal(have, bin) {
		if err := atomicfile.WriteFile(path, bin, 0o755); err != nil {
			return "", fmt.Errorf("install the log driver: %w", err)
		}
	}
	removeOthers(dir, name)
	if err := check(path); err != nil {
		return "", err
	}
	return path, nil
}

// removeOthers deletes the drivers of other builds (a driver running from
// one keeps its file open, and new tasks get this build's) and the
// temporary file of a write cut short.
func removeOthers(dir, keep string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if n := e.Name(); n != keep && (strings.HasPrefix(n, prefix) || strings.HasPrefix(n, "."+prefix)) {
			os.Remove(filepath.Join(dir, n))
		}
	}
}

// check runs the driver once, for at most checkWait. ETXTBSY is retried: a
// process forked while the file was being written holds it open for
// writing until it execs.
func check(path string) error {
	ctx, cancel := context.WithTimeout(context.Background(), checkWait)
	defer cancel()
	for try := 0; ; try++ {
		out, err := exec.CommandContext(ctx, path, "check").Output()
		if errors.Is(err, syscall.ETXTBSY) && try < 10 {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if err != nil {
			return fmt.Errorf("log driver %s does not run: %w", path, err)
		}
		if string(out) != crilog.CheckReply {
			return fmt.Errorf("log driver %s answered %q to check", path, out)
		}
		return nil
	}
}

// Build compiles the driver for the Go environment's platform and gzips
// it into bin/ of this package in the module at root, where a build with
// the noderun_logdriver tag embeds it: what make build does, for the tests
// and the bench that build noderun themselves. It returns the program.
func Build(ctx context.Context, root string) ([]byte, error) {
	dir := filepath.Join(root, "internal", "logdriver", "bin")
	// Built aside and renamed: test packages may build at the same time.
	tmp := filepath.Join(dir, "log-driver.tmp"+strconv.Itoa(os.Getpid()))
	defer os.Remove(tmp)
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w", "-o", tmp, "./internal/logdriver/driver")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build the log driver: %w\n%s", err, b)
	}
	bin, err := os.ReadFile(tmp)
	if err != nil {
		return nil, err
	}
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(bin); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	if err := os.WriteFile(tmp, gz.Bytes(), 0o644); err != nil {
		return nil, err
	}
	return bin, os.Rename(tmp, filepath.Join(dir, "log-driver.gz"))
}
