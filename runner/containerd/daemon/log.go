package daemon

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"
)

// The managed containerd logs to its stderr, a file it holds open for its
// whole life and cannot reopen. So its log is bounded the way logrotate's
// copytruncate does it: once past daemonLogMax, the content is copied to
// <log>.1 (replacing the one before) and the file truncated in place. The
// daemon's descriptor is O_APPEND, so its next write lands at the new end,
// not at its old offset behind a hole. A line written between the copy
// reaching the end and the truncation is lost: the price of a writer that
// cannot reopen.
var (
	daemonLogMax   int64 = 10 << 20
	daemonLogEvery       = 30 * time.Second
)

// boundLog moves path's content to path.1 and empties path when it holds
// max bytes or more; it reports whether it did.
func boundLog(path string, max int64) (bool, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if os.IsNotExist(err) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || st.Size() < max {
		return false, err
	}
	tmp := path + ".1.tmp"
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, st.Mode().Perm())
	if err != nil {
		return false, err
	}
	// Copies up to the end as it is when the copy gets there, so what the
	// daemon wrote meanwhile is kept too.
	_, err = io.Copy(out, f)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path+".1")
	}
	if err != nil {
		os.Remove(tmp)
		return false, fmt.Errorf("rotate %s: %w", path, err)
	}
	if err := f.Truncate(0); err != nil {
		return false, fmt.Errorf("truncate %s: %w", path, err)
	}
	return true, nil
}

// boundDaemonLog checks the managed containerd's log every daemonLogEvery
// until ctx ends.
func (cfg Config) boundDaemonLog(ctx context.Context) {
	t := time.NewTicker(daemonLogEvery)
	defer t.Stop()
	for {
		if rotated, err := boundLog(cfg.managedLog(), daemonLogMax); err != nil {
			cfg.logger().Warn("managed containerd's log not bounded", "err", err)
		} else if rotated {
			cfg.logger().Info("managed containerd's log rotated", "previous", cfg.managedLog()+".1")
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
