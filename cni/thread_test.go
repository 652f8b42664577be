package cni

import (
	"os"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// Threads that leave the host's namespaces never include the main thread,
// whose namespaces /proc/self shows for the whole process.
func TestOnDiscardedThreadSparesTheMainThread(t *testing.T) {
	requireRoot(t)
	before, err := os.Readlink("/proc/self/ns/uts")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 400)
	for range 400 {
		wg.Go(func() {
			onDiscardedThread(func() { errs <- unix.Unshare(unix.CLONE_NEWUTS) })
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if after, err := os.Readlink("/proc/self/ns/uts"); err != nil || after != before {
		t.Errorf("/proc/self/ns/uts is %s (%v) after the threads, was %s", after, err, before)
	}
}
