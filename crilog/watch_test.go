package crilog

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/fsnotify/fsnotify"
	"golang.org/x/sys/unix"
)

// inotifyInstances counts the process's inotify instances.
func inotifyInstances(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && l == "anon_inode:inotify" {
			n++
		}
	}
	return n
}

// followers is how many follows wait on the shared instance.
func followers() int {
	follows.mu.Lock()
	defer follows.mu.Unlock()
	n := 0
	for _, d := range follows.dirs {
		n += len(d.subs)
	}
	return n
}

func dispatching() bool {
	buf := make([]byte, 1<<20)
	return strings.Contains(string(buf[:runtime.Stack(buf, true)]), "(*watchHub).dispatch")
}

// Every follow of the process shares one inotify instance (the host allows
// 128 per user, for every root process): many follows of logs in two
// directories take one, each still sees its log's appends and rotation,
// and the instance and its goroutine go with the last follow.
func TestFollowsShareOneInotifyInstance(t *testing.T) {
	before := inotifyInstances(t)
	var paths []string
	for range 2 {
		p := filepath.Join(t.TempDir(), "0.log")
		writeFile(t, p, rec(0, Stdout, "F", "start"))
		paths = append(paths, p)
	}
	const perLog = 4
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var outs []*syncBuffer
	errs := make(chan error, 2*perLog)
	for i := range 2 * perLog {
		out := &syncBuffer{}
		outs = append(outs, out)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- ReadLog(ctx, paths[i%2], out, ReadOptions{Follow: true, TailLines: -1})
		}()
	}
	waitFor(t, "every follow to watch", func() bool { return followers() == 2*perLog })
	if n := inotifyInstances(t) - before; n != 1 {
		t.Errorf("%d follows took %d inotify instances, want 1", 2*perLog, n)
	}

	for i, p := range paths {
		appendFile(t, p, rec(1, Stdout, "F", fmt.Sprint("appended ", i)))
		if err := os.Rename(p, p+".20260102-030409"); err != nil {
			t.Fatal(err)
		}
		appendFile(t, p, rec(2, Stdout, "F", fmt.Sprint("rotated ", i)))
	}
	for i, out := range outs {
		want := fmt.Sprintf("start\nappended %d\nrotated %d\n", i%2, i%2)
		waitFor(t, fmt.Sprintf("follow %d to see its log's append and rotation", i), func() bool { return out.String() == want })
	}

	cancel()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if n := inotifyInstances(t); n != before {
		t.Errorf("%d inotify instances after the follows ended, want %d", n, before)
	}
	waitFor(t, "the dispatch goroutine to end", func() bool { return !dispatching() })
	follows.mu.Lock()
	defer follows.mu.Unlock()
	if follows.w != nil || len(follows.dirs) != 0 {
		t.Errorf("hub not idle after the last follow: watcher %v, dirs %v", follows.w, follows.dirs)
	}
}

// A follow of a log whose directory was removed and made anew watches the
// new directory, though a follow still has the old one open (which keeps
// the kernel from dropping its watch).
func TestFollowWatchesADirectoryMadeAnew(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pod")
	path := filepath.Join(dir, "0.log")
	follow := func(ctx context.Context, out *syncBuffer) chan error {
		done := make(chan error, 1)
		go func() { done <- ReadLog(ctx, path, out, ReadOptions{Follow: true, TailLines: -1}) }()
		return done
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx1, cancel1 := context.WithCancel(context.Background())
	defer cancel1()
	done1 := follow(ctx1, &syncBuffer{})
	waitFor(t, "the first follow to watch", func() bool { return followers() == 1 })
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	out := &syncBuffer{}
	done2 := follow(ctx2, out)
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the second follow to watch", func() bool {
		follows.mu.Lock()
		defer follows.mu.Unlock()
		d := follows.dirs[dir]
		return d != nil && d.ino == st.Ino && len(d.subs) == 1
	})
	appendFile(t, path, rec(0, Stdout, "F", "new"))
	waitFor(t, "the new directory's log", func() bool { return out.String() == "new\n" })
	cancel1()
	cancel2()
	for _, done := range []chan error{done1, done2} {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
	waitFor(t, "the dispatch goroutine to end", func() bool { return !dispatching() })
}

// A follow that cannot have inotify (the host's instances or watches are
// used up) says so and polls: appends and rotation still come through.
func TestFollowPollsWithoutInotify(t *testing.T) {
	saved := follows.newWatcher
	follows.newWatcher = func() (*fsnotify.Watcher, error) { return nil, unix.EMFILE }
	defer func() { follows.newWatcher = saved }()
	path := filepath.Join(t.TempDir(), "0.log")
	writeFile(t, path, rec(0, Stdout, "F", "start"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &syncBuffer{}
	polling := make(chan error, 1)
	done := make(chan error, 1)
	go func() {
		done <- ReadLog(ctx, path, out, ReadOptions{Follow: true, TailLines: -1, Polling: func(err error) { polling <- err }})
	}()
	if err := <-polling; !errors.Is(err, unix.EMFILE) {
		t.Errorf("Polling told %v, want EMFILE", err)
	}
	appendFile(t, path, rec(1, Stdout, "F", "appended"))
	if err := os.Rename(path, path+".20260102-030409"); err != nil {
		t.Fatal(err)
	}
	appendFile(t, path, rec(2, Stdout, "F", "rotated"))
	waitFor(t, "the append and the rotation", func() bool { return out.String() == "start\nappended\nrotated\n" })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// Without Polling, the follow fails as before.
	err := ReadLog(context.Background(), path, &syncBuffer{}, ReadOptions{Follow: true, TailLines: -1})
	if !errors.Is(err, unix.EMFILE) {
		t.Errorf("follow without Polling: %v, want EMFILE", err)
	}
}

// A follow polls only for want of inotify: a log directory that does not
// exist fails the follow as before, Polling or not.
func TestFollowOfAMissingDirectoryFails(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gone", "0.log")
	err := ReadLog(context.Background(), path, &syncBuffer{}, ReadOptions{Follow: true, TailLines: -1,
		Polling: func(err error) { t.Errorf("polls for %v", err) }})
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ReadLog = %v, want the directory missing", err)
	}
}
