// Package execio holds the streams of an interactive exec (kubectl exec,
// attach), one pair of types shared by the API that receives them
// (kubeapi) and the runtime that runs the command (runner/containerd), so
// that neither imports the other nor copies between two lookalikes.
package execio

import "io"

// ExecIO are the streams of an exec: what the command reads and writes,
// and its terminal.
type ExecIO struct {
	Stdin  io.Reader // nil: the command's stdin is closed
	Stdout io.Writer // nil: discarded
	Stderr io.Writer // nil: discarded; never used with TTY
	// TTY gives the command a terminal; its output is all on Stdout.
	TTY bool
	// Resize carries the terminal's sizes, the first as soon as known
	// (as kubectl sends them); nil without a terminal.
	Resize <-chan TerminalSize
}

// TerminalSize is a terminal's size in characters.
type TerminalSize struct {
	Width, Height uint16
}
