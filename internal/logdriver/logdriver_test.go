package logdriver

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/noderun/noderun/crilog"
	"github.com/noderun/noderun/internal/testenv"
)

// fakeDriver is a program that answers check as the driver does.
func fakeDriver(reply string) []byte {
	return []byte("#!/bin/sh\nprintf '" + strings.ReplaceAll(reply, "\n", `\n`) + "'\n")
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

func TestInstallWritesOnceAndRemovesOtherBuilds(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{prefix + "0123456789abcdef", "." + prefix + "0123456789abcdef.tmp42", "other"} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("x"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bin := fakeDriver(crilog.CheckReply)
	path, err := install(bin, dir)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(path) != dir || !strings.HasPrefix(filepath.Base(path), prefix) {
		t.Fatalf("installed at %s", path)
	}
	for _, n := range []string{prefix + "0123456789abcdef", "." + prefix + "0123456789abcdef.tmp42"} {
		if _, err := os.Stat(filepath.Join(dir, n)); !os.IsNotExist(err) {
			t.Errorf("another build's driver or a cut write's temporary file is still there: %s: %v", n, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "other")); err != nil {
		t.Errorf("a file that is no driver was removed: %v", err)
	}
	ino := inode(t, path)
	again, err := install(bin, dir)
	if err != nil || again != path {
		t.Fatalf("second install: %s, %v", again, err)
	}
	if inode(t, path) != ino {
		t.Error("the same driver was written again")
	}

	// A file of that name with other content (damaged) is replaced.
	if err := os.WriteFile(path, []byte("#!/bin/sh\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := install(bin, dir); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); string(got) != string(bin) {
		t.Errorf("damaged driver kept: %q", got)
	}
	// The next build gets a name of its own and removes this one.
	next, err := install(append(fakeDriver(crilog.CheckReply), "# next\n"...), dir)
	if err != nil {
		t.Fatal(err)
	}
	if next == path {
		t.Fatal("two builds share a name")
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("the previous build's driver is still there: %v", err)
	}
}

func TestInstallFailsWhenTheDriverDoesNotRun(t *testing.T) {
	if _, err := install(fakeDriver("something else\n"), t.TempDir()); err == nil || !strings.Contains(err.Error(), "answered") {
		t.Errorf("a driver answering wrong: %v", err)
	}
	testenv.Require(t, os.Geteuid() == 0, "root, to mount a noexec tmpfs")
	// Under qemu-aarch64 in CI, the forked child whose exec failed once
	// never exited; os/exec waits for it inside Start, past any timeout,
	// until the test binary's 20-minute limit.
	testenv.SkipIfEmulated(t, "qemu-user can hang a forked child whose exec fails")
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_NOEXEC, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	if _, err := install(fakeDriver(crilog.CheckReply), dir); err == nil || !strings.Contains(err.Error(), "does not run") {
		t.Errorf("a driver on a noexec mount: %v", err)
	}
}

func TestInstallWithoutEmbeddedDriver(t *testing.T) {
	if len(embedded) != 0 {
		t.Skip("built with the noderun_logdriver tag")
	}
	dir := filepath.Join(t.TempDir(), "bin")
	path, err := Install(dir)
	if path != "" || err != nil {
		t.Fatalf("Install without a driver: %q, %v", path, err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("dir made for nothing: %v", err)
	}
}

// TestBuiltDriverWritesALog builds the driver as make build does and runs
// it as containerd's shim does, writing the log itself (no collector).
func TestBuiltDriverWritesALog(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the driver")
	}
	testenv.SkipIfEmulated(t, "runs the driver built for the emulated platform")
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bin, err := Build(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	gz, err := os.ReadFile(filepath.Join(root, "internal", "logdriver", "bin", "log-driver.gz"))
	if err != nil {
		t.Fatal(err)
	}
	if zr, err := gzip.NewReader(bytes.NewReader(gz)); err != nil {
		t.Fatal(err)
	} else if b, err := io.ReadAll(zr); err != nil || !bytes.Equal(b, bin) {
		t.Fatalf("the gzipped driver is not the program built: %v", err)
	}
	if len(gz)*2 > len(bin) {
		t.Errorf("gzipped %d bytes of %d", len(gz), len(bin))
	}
	drv, err := install(bin, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}

	pipe := func() (*os.File, *os.File) {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		return r, w
	}
	outR, outW := pipe()
	errR, errW := pipe()
	readyR, readyW := pipe()
	logPath := filepath.Join(t.TempDir(), "0.log")
	cmd := exec.CommandContext(ctx, drv, "log-driver", crilog.Target{Path: logPath}.Arg())
	cmd.ExtraFiles = []*os.File{outR, errR, readyW} // fds 3, 4, 5
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	outR.Close()
	errR.Close()
	readyW.Close()
	// The driver closes the ready pipe once the log is open.
	if _, err := readyR.Read(make([]byte, 1)); err == nil {
		t.Fatal("ready pipe carried data")
	}
	if _, err := os.Stat(logPath); err != nil {
		t.Fatalf("ready before the log exists: %v", err)
	}
	outW.WriteString("hello\n")
	errW.WriteString("oops\n")
	outW.Close()
	errW.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("driver: %v", err)
	}
	b, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		_, stream, partial, content, err := crilog.ParseLine(line)
		if err != nil || partial {
			t.Fatalf("log line %q: partial %v, %v", line, partial, err)
		}
		got[stream] = content
	}
	if got[crilog.Stdout] != "hello" || got[crilog.Stderr] != "oops" || len(got) != 2 {
		t.Errorf("log: %q", b)
	}
}
