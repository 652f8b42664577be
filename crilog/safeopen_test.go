package crilog

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// victim is a host file outside the pod log dir that links planted there
// point to; it looks like a log so that a reader would serve it.
func victim(t *testing.T) (path, content string) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "secret")
	content = rec(0, Stdout, "F", "host secret")
	writeFile(t, path, content)
	return path, content
}

func assertIntact(t *testing.T, path, content string) {
	t.Helper()
	if b, err := os.ReadFile(path); err != nil || string(b) != content {
		t.Errorf("the link's target was written: %q, %v", b, err)
	}
}

// The log driver and the collector run as root and write below the pod log
// dir, where a pod with a hostPath over /var/log can plant links: none is
// followed, whichever part of the log's path it replaces, nor is a hard
// link or a FIFO written to.
func TestWriterFollowsNoLinks(t *testing.T) {
	target, content := victim(t)
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, root, path string)
	}{
		{"log", func(t *testing.T, root, path string) { symlink(t, target, path) }},
		{"hard link", func(t *testing.T, root, path string) {
			if err := os.Link(target, path); err != nil {
				t.Skip(err) // another filesystem
			}
		}},
		{"fifo", func(t *testing.T, root, path string) {
			if err := syscall.Mkfifo(path, 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"container dir", func(t *testing.T, root, path string) {
			os.Remove(filepath.Dir(path))
			symlink(t, filepath.Dir(target), filepath.Dir(path))
		}},
		{"pod dir", func(t *testing.T, root, path string) {
			os.RemoveAll(filepath.Dir(filepath.Dir(path)))
			symlink(t, filepath.Dir(target), filepath.Dir(filepath.Dir(path)))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			path := filepath.Join(root, "ns_pod_uid", "c", filepath.Base(target))
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			tc.plant(t, root, path)
			done := make(chan error, 1)
			go func() {
				done <- serve(Target{Path: path, Root: root}, strings.NewReader("overwritten\n"), strings.NewReader(""), &closeRecorder{}, func(error) {})
			}()
			select {
			case err := <-done:
				// A FIFO without a reader fails the open itself (ENXIO).
				if !errors.Is(err, errLink) && !errors.Is(err, syscall.ENXIO) {
					t.Errorf("serve = %v, want it refused as a link", err)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("the open blocked")
			}
			assertIntact(t, target, content)
		})
	}
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

// Rotation neither compresses a planted link's target into the log dir
// (where kubectl logs would serve it) nor truncates what a planted .gz.tmp
// names.
func TestRotationFollowsNoLinks(t *testing.T) {
	target, content := victim(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "0.log")
	symlink(t, target, path+".20260101-000000")        // an older rotated file
	symlink(t, target, path+".20260101-000001.gz.tmp") // a compression under way
	rt := &rotator{path: path, root: dir, r: Rotation{MaxSize: 1, MaxFiles: 5}, now: time.Now, report: func(error) {}}
	writeFile(t, path+".20260101-000002", rec(0, Stdout, "F", "newest rotated"))
	rt.tidy()
	assertIntact(t, target, content)
	if _, err := os.Stat(path + ".20260101-000000.gz"); err == nil {
		t.Error("the link's target was compressed into the log dir")
	}

	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	symlink(t, target, path+".20260101-000002.gz.tmp")
	if _, err := compress(d, "0.log.20260101-000002"); err == nil {
		t.Error("compress wrote through a planted .gz.tmp")
	}
	assertIntact(t, target, content)
}

// kubectl logs is not served what a link planted below the pod log dir
// names, whichever part of the log's path it replaces.
func TestReadLogFollowsNoLinks(t *testing.T) {
	target, _ := victim(t)
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, path string)
	}{
		{"log", func(t *testing.T, path string) { symlink(t, target, path) }},
		{"rotated file", func(t *testing.T, path string) {
			writeFile(t, path, rec(1, Stdout, "F", "the log"))
			symlink(t, target, path+".20260101-000000")
		}},
		{"hard link", func(t *testing.T, path string) {
			if err := os.Link(target, path); err != nil {
				t.Skip(err)
			}
		}},
		{"container dir", func(t *testing.T, path string) {
			os.Remove(filepath.Dir(path))
			symlink(t, filepath.Dir(target), filepath.Dir(path))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			path := filepath.Join(root, "ns_pod_uid", "c", filepath.Base(target))
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			tc.plant(t, path)
			var out bytes.Buffer
			err := ReadLog(context.Background(), path, &out, ReadOptions{TailLines: -1, Root: root})
			if strings.Contains(out.String(), "host secret") {
				t.Errorf("served the link's target: %q", out.String())
			}
			if !errors.Is(err, errLink) {
				t.Errorf("ReadLog = %v, want it refused as a link", err)
			}
		})
	}
}
