package main

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"

	"github.com/noderun/noderun/crilog"
	"github.com/noderun/noderun/internal/memtrim"
)

// startCollector starts `exe log-collector sock` in a session of its own,
// so that it outlives noderun: it keeps writing the containers' logs while
// noderun restarts. It reports to syslog. Its stderr, where only a crash
// would write, is a file beside the socket: a pipe noderun was given may
// be gone before the collector is.
func startCollector(exe, sock string) func() error {
	return func() error {
		stderr, err := os.OpenFile(strings.TrimSuffix(sock, ".sock")+".stderr", os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			return err
		}
		defer stderr.Close() // the child has its own copy
		cmd := exec.Command(exe, "log-collector", sock)
		cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "NOTIFY_SOCKET=") })
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		cmd.Stderr = stderr
		if err := cmd.Start(); err != nil {
			return err
		}
		go func() { _ = cmd.Wait() }() // reaped if it ends while noderun runs
		return nil
	}
}

// runCollector is the log-collector subcommand. Like the daemon it gives
// memory back once quiet (memtrim): it runs for as long as the node.
func runCollector(ctx context.Context, sock string) error {
	trim := memtrim.New()
	go trim.Run(ctx)
	trim.Activity() // what starting touched
	return crilog.RunCollector(ctx, sock, func(path string, err error) {
		crilog.Syslog("", path)(err)
	}, trim.Activity)
}
