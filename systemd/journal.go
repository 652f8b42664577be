package systemd

import (
	"context"
	"log/slog"
	"slices"
	"strings"

	"github.com/coreos/go-systemd/v22/journal"
)

// StderrIsJournal reports whether stderr is connected to the journal, as
// JOURNAL_STREAM says (systemd.exec(5)): only then does noderun log to it
// natively. Redirected elsewhere (a file, a terminal), it keeps stderr.
func StderrIsJournal() bool {
	ok, err := journal.StderrIsJournalStream()
	return ok && err == nil
}

// JournalSender sends one journal entry; journal.Send in production.
type JournalSender func(msg string, p journal.Priority, fields map[string]string) error

// JournalHandler is an slog.Handler writing to journald with each attribute
// as a field of its own (POD=default/web, ERR=...), so that `journalctl
// POD=default/web` finds a pod's entries, and levels as syslog priorities.
// An entry the journal does not take goes to fallback, not nowhere.
type JournalHandler struct {
	level    slog.Leveler
	ident    string
	send     JournalSender
	fallback slog.Handler
	fields   map[string]string // from WithAttrs, already named
	prefix   string            // from WithGroup: GROUP_
}

var _ slog.Handler = (*JournalHandler)(nil)

// NewJournalHandler returns a handler for entries at level and above,
// tagged SYSLOG_IDENTIFIER=ident; send nil is journal.Send.
func NewJournalHandler(level slog.Leveler, ident string, send JournalSender, fallback slog.Handler) *JournalHandler {
	if send == nil {
		send = journal.Send
	}
	return &JournalHandler{level: level, ident: ident, send: send, fallback: fallback}
}

// Enabled implements slog.Handler.
func (h *JournalHandler) Enabled(_ context.Context, l slog.Level) bool {
	return l >= h.level.Level()
}

// Handle implements slog.Handler.
func (h *JournalHandler) Handle(ctx context.Context, r slog.Record) error {
	fields := make(map[string]string, len(h.fields)+r.NumAttrs()+1)
	for k, v := range h.fields {
		fields[k] = v
	}
	r.Attrs(func(a slog.Attr) bool {
		addField(fields, h.prefix, a)
		return true
	})
	fields["SYSLOG_IDENTIFIER"] = h.ident
	if err := h.send(r.Message, Priority(r.Level), fields); err != nil {
		return h.fallback.Handle(ctx, r)
	}
	return nil
}

// WithAttrs implements slog.Handler.
func (h *JournalHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	out := *h
	out.fields = make(map[string]string, len(h.fields)+len(attrs))
	for k, v := range h.fields {
		out.fields[k] = v
	}
	for _, a := range attrs {
		addField(out.fields, h.prefix, a)
	}
	out.fallback = h.fallback.WithAttrs(attrs)
	return &out
}

// WithGroup implements slog.Handler.
func (h *JournalHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	out := *h
	out.prefix = h.prefix + fieldName(name) + "_"
	out.fallback = h.fallback.WithGroup(name)
	return &out
}

// Priority maps slog levels to syslog priorities as journald shows them:
// debug 7, info 6, warn 4, error 3; levels between round down to the more
// severe one's.
func Priority(l slog.Level) journal.Priority {
	switch {
	case l >= slog.LevelError:
		return journal.PriErr
	case l >= slog.LevelWarn:
		return journal.PriWarning
	case l >= slog.LevelInfo:
		return journal.PriInfo
	}
	return journal.PriDebug
}

func addField(fields map[string]string, prefix string, a slog.Attr) {
	v := a.Value.Resolve()
	if a.Equal(slog.Attr{}) {
		return
	}
	if v.Kind() == slog.KindGroup {
		p := prefix
		if a.Key != "" {
			p += fieldName(a.Key) + "_"
		}
		for _, g := range v.Group() {
			addField(fields, p, g)
		}
		return
	}
	fields[prefix+fieldName(a.Key)] = v.String()
}

// fieldName makes a journal field name of key: upper case letters, digits
// and underscores, not starting with an underscore (those are trusted
// fields journald sets) or a digit.
func fieldName(key string) string {
	b := []byte(strings.ToUpper(key))
	for i, c := range b {
		if !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			b[i] = '_'
		}
	}
	if len(b) == 0 || b[0] == '_' || b[0] >= '0' && b[0] <= '9' {
		b = slices.Insert(b, 0, 'F')
	}
	return string(b)
}
