package crilog

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

// FuzzParseLine: any text parses or fails with ErrBadLine, and a parsed
// record written out again parses to the same values.
func FuzzParseLine(f *testing.F) {
	f.Add("2026-01-02T15:04:05.123456789Z stdout F hello world\n")
	f.Add("2026-01-02T15:04:05Z stderr P part")
	f.Add("2026-01-02T15:04:05+02:00 stdout F ")
	f.Add("2026-01-02T15:04:05Z stdin F x")
	f.Add("not a record")
	f.Fuzz(func(t *testing.T, line string) {
		ts, stream, partial, content, err := ParseLine(line)
		if err != nil {
			if !errors.Is(err, ErrBadLine) {
				t.Fatalf("ParseLine(%q): %v does not wrap ErrBadLine", line, err)
			}
			return
		}
		tag := tagFull
		if partial {
			tag = tagPartial
		}
		again := ts.Format(time.RFC3339Nano) + " " + stream + " " + tag + " " + content
		ts2, stream2, partial2, content2, err := ParseLine(again)
		if err != nil || !ts2.Equal(ts) || stream2 != stream || partial2 != partial || content2 != content {
			t.Fatalf("%q parsed, but its rewrite %q gave %v %q %v %q, %v", line, again, ts2, stream2, partial2, content2, err)
		}
	})
}

// FuzzCopyStream: whatever a container writes, the records the driver
// makes parse, and joining partial records up to each full one gives back
// the lines written (without "\n" or "\r\n"); an unterminated tail comes
// back as partial records.
func FuzzCopyStream(f *testing.F) {
	f.Add([]byte("one\ntwo\r\nthree"))
	f.Add([]byte("\n\n\r\n\r"))
	f.Add([]byte("a\rb\n\r\r\n"))
	f.Add(bytes.Repeat([]byte("x"), MaxLineLen+3))
	f.Add(append(bytes.Repeat([]byte("y"), MaxLineLen), "\r\nz"...))
	f.Fuzz(func(t *testing.T, in []byte) {
		var out bytes.Buffer
		w := &recordWriter{w: &out, now: time.Now}
		if err := copyStream(w, bytes.NewReader(in), Stdout); err != nil {
			t.Fatal(err)
		}
		var got []string
		var line strings.Builder
		pending := false
		for _, rec := range strings.SplitAfter(out.String(), "\n") {
			if rec == "" {
				continue
			}
			_, stream, partial, content, err := ParseLine(rec)
			if err != nil || stream != Stdout {
				t.Fatalf("record %q: stream %q, %v", rec, stream, err)
			}
			if len(content) > MaxLineLen {
				t.Fatalf("record of %d bytes, over MaxLineLen", len(content))
			}
			line.WriteString(content)
			pending = partial
			if !partial {
				got = append(got, line.String())
				line.Reset()
			}
		}
		if pending {
			got = append(got, line.String())
		}
		want := wantLines(in)
		if strings.Join(got, "\x00") != strings.Join(want, "\x00") || len(got) != len(want) {
			t.Fatalf("lines %q, want %q", got, want)
		}
	})
}

// wantLines splits what a container wrote as the driver should: each
// "\n"-terminated line without it and one "\r" before it, then the
// unterminated tail, if any, as it is.
func wantLines(in []byte) []string {
	parts := strings.Split(string(in), "\n")
	lines := make([]string, 0, len(parts))
	for _, p := range parts[:len(parts)-1] {
		lines = append(lines, strings.TrimSuffix(p, "\r"))
	}
	if tail := parts[len(parts)-1]; tail != "" {
		lines = append(lines, tail)
	}
	return lines
}
