package main

import (
	"fmt"
	"log/slog"
	"os"
	"syscall"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/noderun/noderun/systemd"
)

// Under systemd (stderr is the journal) noderun logs to the journal unless
// a format is asked for; elsewhere it keeps text.
func TestLoggerPicksTheJournalOnlyUnderSystemd(t *testing.T) {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(os.Stderr.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	journalStream := fmt.Sprintf("%d:%d", st.Dev, st.Ino)
	tests := []struct {
		name, stream string
		args         []string
		journal      bool
	}{
		{"under systemd", journalStream, nil, true},
		{"format asked for", journalStream, []string{"--log-format", "text"}, false},
		{"journal asked for", "", []string{"--log-format", "journal"}, true},
		{"stderr elsewhere", "", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("JOURNAL_STREAM", tt.stream)
			var h slog.Handler
			app := &cli.App{Flags: flags(), Action: func(c *cli.Context) error {
				log, err := newLogger(c)
				if err == nil {
					h = log.Handler()
				}
				return err
			}}
			if err := app.Run(append([]string{"noderun"}, tt.args...)); err != nil {
				t.Fatal(err)
			}
			if _, ok := h.(*systemd.JournalHandler); ok != tt.journal {
				t.Fatalf("handler %T, want journal: %v", h, tt.journal)
			}
		})
	}
}
