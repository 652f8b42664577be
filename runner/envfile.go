package runner

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/runner/volume"
)

// fileKeyValue resolves an env variable's fileKeyRef (KEP-3721) from the
// file in the pod's emptyDir, as the kubelet v1.37 does when it makes the
// container's environment: a missing or malformed file fails the start
// ("couldn't parse env file"), a missing key too unless optional (skip is
// then true). As in the kubelet, a key with an empty value counts as missing. The
// file is opened beneath the volume, since the pod's containers write it.
func fileKeyValue(podDir string, ref *v1.FileKeySelector) (val string, skip bool, err error) {
	dir := emptyDirPath(podDir, ref.VolumeName)
	f, err := volume.OpenFileBeneath(dir, ref.Path)
	if err == nil {
		val, err = envFileValue(f, ref.Key)
		f.Close()
	}
	if err != nil {
		return "", false, fmt.Errorf("couldn't parse env file: %w", err)
	}
	if val == "" {
		if ref.Optional != nil && *ref.Optional {
			return "", true, nil
		}
		return "", false, fmt.Errorf("environment variable key %q not found in file %q", ref.Key, dir+"/"+ref.Path)
	}
	return val, false, nil
}

// envFileValue is key's value in an env file of the kubelet's strict
// format: KEY='value' lines, the value taken literally and possibly over
// several lines, blank lines and # comments between them, a # comment
// after the closing quote. "KEY= 'x'" (a blank after =) sets it empty, as
// in a shell. The first assignment of key wins; lines after it are not
// read, as by the kubelet.
func envFileValue(r io.Reader, key string) (string, error) {
	sc := bufio.NewScanner(r)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimLeft(sc.Text(), " \t")
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest, ok := strings.Cut(line, "=")
		switch {
		case !ok:
			return "", fmt.Errorf("line %d: missing '='", n)
		case strings.TrimRight(name, " \t") == "":
			return "", fmt.Errorf("line %d: empty variable name", n)
		case strings.TrimRight(name, " \t") != name:
			return "", fmt.Errorf("line %d: whitespace before '=' is not allowed", n)
		case rest != "" && (rest[0] == ' ' || rest[0] == '\t'):
			if name == key {
				return "", nil
			}
			continue
		case !strings.HasPrefix(rest, "'"):
			return "", fmt.Errorf("line %d: value must be enclosed in single quotes", n)
		}
		val, err := quoted(sc, rest[1:], &n)
		if err != nil || name == key {
			return val, err
		}
	}
	return "", sc.Err()
}

// quoted reads a value from after its opening quote up to the closing one,
// going on to the next lines (joined by newlines) until it finds it.
func quoted(sc *bufio.Scanner, rest string, n *int) (string, error) {
	start := *n
	var b strings.Builder
	for {
		if val, after, ok := strings.Cut(rest, "'"); ok {
			after = strings.TrimLeft(after, " \t")
			if after != "" && after[0] != '#' {
				return "", fmt.Errorf("line %d: unexpected content after closing quote", *n)
			}
			b.WriteString(val)
			return b.String(), nil
		}
		b.WriteString(rest)
		b.WriteByte('\n')
		if !sc.Scan() {
			return "", errors.Join(fmt.Errorf("line %d: unclosed single quote", start), sc.Err())
		}
		*n++
		rest = sc.Text()
	}
}
