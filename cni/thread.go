package cni

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// onDiscardedThread runs f on a locked OS thread that is not the main thread
// and ends that thread when f returns, so f may move it into other
// namespaces without other goroutines ever running there.
//
// The main thread is refused because it is the one /proc/self shows: a main
// thread left in a pod's mount or network namespace would change
// /proc/self/mountinfo and /proc/self/net for the whole process (and the
// runtime never ends the main thread; it parks it). When the goroutine lands
// on it, it holds it locked while another goroutine, which then cannot get
// it, does the work.
func onDiscardedThread(f func()) {
	done := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			onDiscardedThread(f)
			runtime.UnlockOSThread()
			close(done)
			return
		}
		// Never unlocked: the runtime ends the thread with this goroutine.
		f()
		close(done)
	}()
	<-done
}
