package ociimage

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// BusyboxPath is where Debian's busybox-static installs the binary.
const BusyboxPath = "/bin/busybox"

// ErrNoStaticBusybox means the host has no statically linked busybox to copy.
var ErrNoStaticBusybox = errors.New("no static busybox on this host (apt-get install busybox-static)")

const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Busybox returns a busybox image named name built from the host's static
// busybox: every applet linked in /bin, root and nobody users, /tmp and an
// empty /var/www for httpd.
func Busybox(name string) (Image, error) {
	bin, err := readStatic(BusyboxPath)
	if err != nil {
		return Image{}, err
	}
	applets, err := applets(BusyboxPath)
	if err != nil {
		return Image{}, err
	}
	files := map[string]File{
		"/bin/busybox": Regular(bin, 0o755),
		"/etc/passwd":  Regular([]byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home:/bin/false\n"), 0o644),
		"/etc/group":   Regular([]byte("root:x:0:\nnobody:x:65534:\n"), 0o644),
		"/root":        Dir(0o700),
		"/home":        Dir(0o755),
		"/tmp":         Dir(0o777 | os.ModeSticky),
		"/var/www":     Dir(0o755),
	}
	for _, a := range applets {
		if a != "busybox" {
			files["/bin/"+a] = Symlink("busybox")
		}
	}
	if _, ok := files["/bin/printenv"]; !ok {
		// Debian's busybox-static has no printenv applet; the busybox
		// images real manifests name do.
		files["/bin/printenv"] = Regular([]byte(printenvScript), 0o755)
	}
	return Image{Name: name, Files: files, Cmd: []string{"sh"}, Env: []string{defaultPath}}, nil
}

// printenvScript does what printenv does: the named variables' values, a
// line each (exit 1 if one is unset), or the whole environment.
const printenvScript = `#!/bin/sh
[ $# -eq 0 ] && exec env
rc=0
for v; do
	if eval "[ -n \"\${$v+x}\" ]"; then eval "printf '%s\n' \"\$$v\""; else rc=1; fi
done
exit $rc
`

// readStatic returns the binary at path, refusing one that needs a dynamic
// loader: the image carries no libraries.
func readStatic(path string) ([]byte, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoStaticBusybox, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return nil, fmt.Errorf("%w: %s is dynamically linked", ErrNoStaticBusybox, path)
		}
	}
	return os.ReadFile(path)
}

func applets(path string) ([]string, error) {
	out, err := exec.Command(path, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list: %w", path, err)
	}
	var names []string
	for _, name := range strings.Fields(string(bytes.TrimSpace(out))) {
		if !strings.Contains(name, "/") {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("%s --list printed no applets", path)
	}
	return names, nil
}
