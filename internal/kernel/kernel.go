// Package kernel checks the running Linux kernel against the oldest one
// noderun supports.
package kernel

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Version is a kernel's major and minor number: what decides which
// system calls it has.
type Version struct{ Major, Minor int }

func (v Version) String() string { return fmt.Sprintf("%d.%d", v.Major, v.Minor) }

// Less reports whether v is older than w.
func (v Version) Less(w Version) bool {
	return v.Major < w.Major || v.Major == w.Major && v.Minor < w.Minor
}

// Minimum is the oldest kernel noderun runs on: the first LTS with
// pidfd_open (5.3), which noderun needs to kill a container process that
// containerd lost without hitting another process given the same PID.
// Later system calls have fallbacks: openat2 (5.6) a component-by-component
// walk, fchmodat2 (6.6) a chmod through /proc/self/fd.
var Minimum = Version{5, 4}

// ErrUnknown marks a release whose version cannot be read.
var ErrUnknown = errors.New("kernel release not understood")

// ParseRelease reads the version that begins a kernel release (uname -r):
// "5.15.0-91-generic", "6.1.0-rpi7-rpi-v8", "4.18.0-553.el8_10.x86_64",
// "6.8.0-rc3+", "6.6": digits, a dot, digits, then anything not a digit.
func ParseRelease(release string) (Version, error) {
	major, rest, ok1 := leadingNumber(strings.TrimSpace(release))
	rest, ok2 := strings.CutPrefix(rest, ".")
	minor, _, ok3 := leadingNumber(rest)
	if !ok1 || !ok2 || !ok3 {
		return Version{}, fmt.Errorf("%w: %q does not begin with MAJOR.MINOR", ErrUnknown, release)
	}
	return Version{major, minor}, nil
}

// leadingNumber reads the decimal digits s begins with.
func leadingNumber(s string) (n int, rest string, ok bool) {
	end := strings.IndexFunc(s, func(r rune) bool { return r < '0' || r > '9' })
	if end < 0 {
		end = len(s)
	}
	n, err := strconv.Atoi(s[:end])
	return n, s[end:], end > 0 && err == nil
}

// Check returns an error naming release when it is older than Minimum, or
// one marked ErrUnknown when its version cannot be read.
func Check(release string) error {
	v, err := ParseRelease(release)
	if err != nil {
		return err
	}
	if v.Less(Minimum) {
		return fmt.Errorf("Linux %s is older than %s, the oldest noderun runs on: it needs pidfd_open (Linux 5.3) to kill a container process containerd lost without hitting another process given its PID", release, Minimum)
	}
	return nil
}

// Release is the running kernel's release (uname -r), "" if unknown.
func Release() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}
