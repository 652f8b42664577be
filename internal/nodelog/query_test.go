package nodelog

import (
	"io/fs"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"
)

// Every error the kubelet's newNodeLogQuery (400) and validate (406)
// give, with its text.
func TestQueryErrors(t *testing.T) {
	missing := func(string) error { return &fs.PathError{Op: "statat", Path: "nope.log", Err: fs.ErrNotExist} }
	exists := func(string) error { return nil }
	tests := []struct {
		name    string
		query   string
		parse   string // Parse's error (a 400)
		invalid string // Validate's error (a 406)
	}{
		{"blank query", "query=%20%20", `query: Invalid value: ["  "]: query cannot be empty`, ""},
		{"bad sinceTime", "query=a&sinceTime=yesterday", `sinceTime: Invalid value: "yesterday": invalid time format`, ""},
		{"bad untilTime", "query=a&untilTime=2026-01-01", `untilTime: Invalid value: "2026-01-01": invalid time format`, ""},
		{"bad boot", "query=a&boot=x", `boot: Invalid value: "x": strconv.Atoi: parsing "x": invalid syntax`, ""},
		{"bad tailLines", "query=a&tailLines=1.5", `tailLines: Invalid value: "1.5": strconv.Atoi: parsing "1.5": invalid syntax`, ""},
		{"two parse errors", "query=a&boot=x&tailLines=y", `[boot: Invalid value: "x": strconv.Atoi: parsing "x": invalid syntax, tailLines: Invalid value: "y": strconv.Atoi: parsing "y": invalid syntax]`, ""},
		{"unsafe service", "query=a%3Bb", "", `query: Invalid value: "a;b": input contains unsupported characters`},
		{"long service", "query=" + strings.Repeat("a", 257), "", `query: Invalid value: "` + strings.Repeat("a", 257) + `": length must be less than 100`},
		{"five services", "query=a&query=b&query=c&query=d&query=e", "", `query: Too many: 5: must have at most 4 items`},
		{"options only", "tailLines=5", "", `query: Required value: cannot be empty with options`},
		{"file and service", "query=a&query=/b.log", "", `query: Invalid value: "[/b.log], [a]": cannot specify a file and service`},
		{"two files", "query=/a.log&query=/b.log", "", `query: Invalid value: ["/a.log","/b.log"]: cannot specify more than one file`},
		{"file with options", "query=/a.log&tailLines=5", "", `query: Invalid value: ["/a.log"]: cannot specify file with options`},
		{"since after until", "query=a&sinceTime=2026-01-02T00:00:00Z&untilTime=2026-01-01T00:00:00Z", "", "untilTime: Invalid value: \"2026-01-01T00:00:00Z\": must be after `sinceTime`"},
		{"boot after now", "query=a&boot=1", "", `boot: Invalid value: 1: must be less than 1`},
		{"negative tailLines", "query=a&tailLines=-1", "", `tailLines: Invalid value: -1: must be between 0 and 100000, inclusive`},
		{"huge tailLines", "query=a&tailLines=100001", "", `tailLines: Invalid value: 100001: must be between 0 and 100000, inclusive`},
		{"bad pattern", "query=a&pattern=(", "", "pattern: Invalid value: \"(\": error parsing regexp: missing closing ): `(`"},
		{"valid", "query=noderun&query=containerd&sinceTime=2026-01-01T00:00:00Z&untilTime=2026-01-02T00:00:00Z&tailLines=100000&boot=-1&pattern=a.b", "", ""},
		{"valid file", "query=/syslog", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, err := url.ParseQuery(tt.query)
			if err != nil {
				t.Fatal(err)
			}
			n, errs := Parse(q)
			if got := errs.ToAggregate(); tt.parse != "" || got != nil {
				if got == nil || got.Error() != tt.parse {
					t.Fatalf("Parse: %v, want %s", got, tt.parse)
				}
				return
			}
			got := n.Validate(exists).ToAggregate()
			if (got == nil) != (tt.invalid == "") || (got != nil && got.Error() != tt.invalid) {
				t.Fatalf("Validate: %v, want %q", got, tt.invalid)
			}
		})
	}
	n, _ := Parse(url.Values{"query": {"/nope.log"}})
	if got := n.Validate(missing).ToAggregate(); got == nil || got.Error() != `query: Invalid value: ["/nope.log"]: statat nope.log: file does not exist` {
		t.Errorf("a missing file: %v", got)
	}
}

// No parameter at all is no query: the path names what to serve.
func TestParseNoQuery(t *testing.T) {
	if n, errs := Parse(url.Values{"other": {"x"}}); n != nil || errs != nil {
		t.Errorf("Parse = %v, %v; want nil, nil", n, errs)
	}
}

// The arguments are the kubelet's, in its order; times in UTC, which
// --utc reads them as.
func TestJournalArgs(t *testing.T) {
	cet := time.FixedZone("CET", 3600)
	since := time.Date(2026, 1, 2, 4, 4, 5, 0, cet)
	until := time.Date(2026, 11, 12, 13, 14, 15, 0, time.UTC)
	tail, boot := 20, -1
	tests := []struct {
		name  string
		q     Query
		units []string
		want  []string
	}{
		{"bare", Query{}, []string{"noderun"}, []string{"--utc", "--no-pager", "--output=short-precise", "--unit=noderun"}},
		{"all", Query{Options: Options{SinceTime: &since, UntilTime: &until, TailLines: &tail, Boot: &boot, Pattern: "a(b|c)"}},
			[]string{"noderun", "", "containerd"},
			[]string{"--utc", "--no-pager", "--output=short-precise", "--since=2026-1-2 03:4:5", "--until=2026-11-12 13:14:15",
				"--pager-end", "--lines=20", "--unit=noderun", "--unit=containerd", "--grep=a(b|c)", "--boot", "-1"}},
	}
	for _, tt := range tests {
		if got := tt.q.JournalArgs(tt.units); !slices.Equal(got, tt.want) {
			t.Errorf("%s: %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestInRoot(t *testing.T) {
	for in, want := range map[string]string{"/syslog": "syslog", "a/b.log": "a/b.log", "/../../etc/passwd": "etc/passwd", "/": ".", "//x//y": "x/y"} {
		if got := inRoot(in); got != want {
			t.Errorf("inRoot(%q) = %q, want %q", in, got, want)
		}
	}
}
