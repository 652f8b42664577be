package manifests

import (
	"errors"
	"strconv"
	"strings"
)

// ErrTooLarge is the cause of a ManifestError for a file over MaxFileSize.
var ErrTooLarge = errors.New("manifest file is larger than 10 MiB")

// MaxFileSize bounds what a source reads from one file, so a stray log or
// image dropped into the manifest directory cannot exhaust memory.
const MaxFileSize = 10 << 20

// ManifestError locates one problem in a manifest. File and Line are filled in
// by sources; Decode knows only lines, Validate only fields.
type ManifestError struct {
	File    string
	Line    int
	Column  int    // of Field's key, when found
	Field   string // JSON path such as "spec.containers[0].image"
	Message string
	Err     error // underlying cause, if any; Message is used when set
}

// Error reads "file:line:column: field: message", leaving out empty parts.
func (e *ManifestError) Error() string {
	var parts []string
	loc := e.File
	if e.Line > 0 {
		if loc == "" {
			loc = "line " + strconv.Itoa(e.Line)
		} else {
			loc += ":" + strconv.Itoa(e.Line)
		}
		if e.Column > 0 {
			loc += ":" + strconv.Itoa(e.Column)
		}
	}
	for _, p := range []string{loc, e.Field, e.Detail()} {
		if p != "" {
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, ": ")
}

// Detail is the message without location: Message, or else the cause's text.
func (e *ManifestError) Detail() string {
	if e.Message == "" && e.Err != nil {
		return e.Err.Error()
	}
	return e.Message
}

func (e *ManifestError) Unwrap() error { return e.Err }

// locate sets File and, when the error has none, Line on every ManifestError
// in errs.
func locate(errs []error, file string, line int) {
	for _, err := range errs {
		var me *ManifestError
		if errors.As(err, &me) {
			me.File = file
			if me.Line == 0 {
				me.Line = line
			}
		}
	}
}

// locateFields puts each ManifestError that names a field and has no line
// yet at the line and column of that field's key in c.
func locateFields(errs []error, c chunk) {
	for _, err := range errs {
		var me *ManifestError
		if errors.As(err, &me) && me.Line == 0 && me.Field != "" {
			me.Line, me.Column = keyPos(c, me.Field)
		}
	}
}
