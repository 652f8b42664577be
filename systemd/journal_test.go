package systemd

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/coreos/go-systemd/v22/journal"
)

type entry struct {
	msg    string
	pri    journal.Priority
	fields map[string]string
}

func recorder(entries *[]entry, err error) JournalSender {
	return func(msg string, p journal.Priority, f map[string]string) error {
		*entries = append(*entries, entry{msg, p, maps.Clone(f)})
		return err
	}
}

func TestJournalHandlerFields(t *testing.T) {
	var got []entry
	log := slog.New(NewJournalHandler(slog.LevelDebug, "noderun", recorder(&got, nil), slog.DiscardHandler))
	log.With("pod", "default/web").WithGroup("pull").Warn("image pull failed",
		"err", errors.New("connection refused"), "attempt", 3, slog.Group("image", "ref", "busybox:1.36"), "1st-try", true)
	if len(got) != 1 {
		t.Fatalf("%d entries, want 1", len(got))
	}
	want := map[string]string{
		"POD": "default/web", "PULL_ERR": "connection refused", "PULL_ATTEMPT": "3",
		"PULL_IMAGE_REF": "busybox:1.36", "PULL_F1ST_TRY": "true", "SYSLOG_IDENTIFIER": "noderun",
	}
	if e := got[0]; e.msg != "image pull failed" || e.pri != journal.PriWarning || !maps.Equal(e.fields, want) {
		t.Fatalf("got %q priority %d fields %v;\nwant %q priority %d fields %v", e.msg, e.pri, e.fields, "image pull failed", journal.PriWarning, want)
	}
}

func TestJournalPriorities(t *testing.T) {
	for _, tc := range []struct {
		level slog.Level
		want  journal.Priority
	}{
		{slog.LevelDebug, journal.PriDebug},
		{slog.LevelInfo, journal.PriInfo},
		{slog.LevelInfo + 2, journal.PriInfo},
		{slog.LevelWarn, journal.PriWarning},
		{slog.LevelError, journal.PriErr},
		{slog.LevelError + 4, journal.PriErr},
	} {
		if got := Priority(tc.level); got != tc.want {
			t.Errorf("Priority(%v) = %d, want %d", tc.level, got, tc.want)
		}
	}
}

func TestJournalHandlerLevel(t *testing.T) {
	var got []entry
	log := slog.New(NewJournalHandler(slog.LevelInfo, "noderun", recorder(&got, nil), slog.DiscardHandler))
	log.Debug("hidden")
	log.Info("shown")
	if len(got) != 1 || got[0].msg != "shown" || got[0].pri != journal.PriInfo {
		t.Fatalf("entries %+v; want only the info one", got)
	}
}

// What the journal does not take goes to the fallback, attributes and
// all, rather than nowhere.
func TestJournalHandlerFallsBack(t *testing.T) {
	var got []entry
	var buf bytes.Buffer
	fallback := slog.NewTextHandler(&buf, nil)
	log := slog.New(NewJournalHandler(slog.LevelInfo, "noderun", recorder(&got, errors.New("no journal socket")), fallback))
	log.With("pod", "default/web").Error("teardown failed")
	if out := buf.String(); !strings.Contains(out, `msg="teardown failed"`) || !strings.Contains(out, "pod=default/web") {
		t.Fatalf("fallback got %q", out)
	}
}

func TestStderrIsJournal(t *testing.T) {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(os.Stderr.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	t.Setenv("JOURNAL_STREAM", fmt.Sprintf("%d:%d", st.Dev, st.Ino))
	if !StderrIsJournal() {
		t.Error("JOURNAL_STREAM naming stderr: not taken for the journal")
	}
	t.Setenv("JOURNAL_STREAM", fmt.Sprintf("%d:%d", st.Dev, st.Ino+1))
	if StderrIsJournal() {
		t.Error("JOURNAL_STREAM naming another stream (stderr redirected): taken for the journal")
	}
	os.Unsetenv("JOURNAL_STREAM")
	if StderrIsJournal() {
		t.Error("no JOURNAL_STREAM: taken for the journal")
	}
}
