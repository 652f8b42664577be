package containerd

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// withDefaultAppArmorProfile is containerd's
// contrib/apparmor.WithDefaultProfile, the CRI plugin's RuntimeDefault:
// it loads containerd's default profile under name unless the kernel has
// it, and sets it. Written here because containerd renders the profile
// with text/template: a reachable template execution keeps every exported
// method of every type in the binary (the linker cannot tell which one a
// template calls), 4.8 MB of noderun's with urfave/cli's help, the other
// one (third_party/urfave-cli-v2). TestDefaultAppArmorProfile proves the
// text the same as containerd's.
func withDefaultAppArmorProfile(name string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *specs.Spec) error {
		if err := loadDefaultAppArmorProfile(name); err != nil {
			return err
		}
		s.Process.ApparmorProfile = name
		return nil
	}
}

// loadDefaultAppArmorProfile is containerd's LoadDefaultProfile: the
// profile is written to a temporary file and loaded by apparmor_parser.
func loadDefaultAppArmorProfile(name string) error {
	if loaded, err := appArmorListed(name + " "); err != nil || loaded {
		return err
	}
	p := hostAppArmorData(name)
	f, err := os.CreateTemp(os.Getenv("XDG_RUNTIME_DIR"), p.name)
	if err != nil {
		return err
	}
	defer f.Close()
	path := f.Name()
	defer os.Remove(path)
	if _, err := f.WriteString(p.text()); err != nil {
		return err
	}
	if out, err := exec.Command("apparmor_parser", "-Kr", path).CombinedOutput(); err != nil {
		err = fmt.Errorf("parser error(%q): %w", strings.TrimSpace(string(out)), err)
		return fmt.Errorf("load apparmor profile %s: %w", path, err)
	}
	return nil
}

// appArmorListed reports whether a line of the kernel's profile list
// starts with prefix.
func appArmorListed(prefix string) (bool, error) {
	f, err := os.Open("/sys/kernel/security/apparmor/profiles")
	if err != nil {
		return false, err
	}
	defer f.Close()
	r := bufio.NewReader(f)
	for {
		line, err := r.ReadString('\n')
		if err == io.EOF {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if strings.HasPrefix(line, prefix) {
			return true, nil
		}
	}
}

// appArmorData is what containerd's default profile varies by.
type appArmorData struct {
	name, abi            string
	imports, innerImport []string
	daemon, rootlessKit  string // profiles allowed to signal the container
}

// hostAppArmorData finds what the host's AppArmor offers, as
// containerd's loadData does.
func hostAppArmorData(name string) appArmorData {
	p := appArmorData{name: name}
	macro := func(m string) bool {
		_, err := os.Stat(filepath.Join("/etc/apparmor.d", m))
		return err == nil
	}
	if macro("abi/3.0") {
		p.abi = "abi/3.0"
	}
	if macro("tunables/global") {
		p.imports = append(p.imports, "#include <tunables/global>")
	} else {
		p.imports = append(p.imports, "@{PROC}=/proc/")
	}
	if macro("abstractions/base") {
		p.innerImport = append(p.innerImport, "#include <abstractions/base>")
	}
	// Ours, as the daemon's: the profile name without its " (enforce)".
	current, _ := os.ReadFile("/proc/self/attr/current")
	p.daemon, _, _ = strings.Cut(string(current), " ")
	if p.daemon == "" {
		p.daemon = "unconfined"
	}
	p.rootlessKit, _ = exec.LookPath("rootlesskit")
	return p
}

// text is containerd's default profile for p, byte for byte.
func (p appArmorData) text() string {
	var b strings.Builder
	b.WriteString("\n")
	if p.abi != "" {
		b.WriteString("abi <" + p.abi + ">,\n")
	}
	b.WriteString("\n")
	for _, v := range p.imports {
		b.WriteString("\n" + v + "\n")
	}
	b.WriteString("\n\nprofile " + p.name + " flags=(attach_disconnected,mediate_deleted) {\n")
	for _, v := range p.innerImport {
		b.WriteString("\n  " + v + "\n")
	}
	b.WriteString(`

  network,
  capability,
  file,
  umount,
  # Host (privileged) processes may send signals to container processes.
  signal (receive) peer=unconfined,
  # runc may send signals to container processes.
  signal (receive) peer=runc,
  # crun may send signals to container processes.
  signal (receive) peer=crun,
  # Manager may send signals to container processes.
  signal (receive) peer=` + p.daemon + `,
  # Container processes may send signals amongst themselves.
  signal (send,receive) peer=` + p.name + `,
`)
	if p.rootlessKit != "" {
		b.WriteString("\n  # https://github.com/containerd/nerdctl/issues/2730\n  signal (receive) peer=" + p.rootlessKit + ",\n")
	}
	b.WriteString(`

  deny @{PROC}/* w,   # deny write for all files directly in /proc (not in a subdir)
  # deny write to files not in /proc/<number>/** or /proc/sys/**
  deny @{PROC}/{[^1-9],[^1-9][^0-9],[^1-9s][^0-9y][^0-9s],[^1-9][^0-9][^0-9][^0-9]*}/** w,
  deny @{PROC}/sys/[^k]** w,  # deny /proc/sys except /proc/sys/k* (effectively /proc/sys/kernel)
  deny @{PROC}/sys/kernel/{?,??,[^s][^h][^m]**} w,  # deny everything except shm* in /proc/sys/kernel/
  deny @{PROC}/sysrq-trigger rwklx,
  deny @{PROC}/mem rwklx,
  deny @{PROC}/kmem rwklx,
  deny @{PROC}/kcore rwklx,

  deny mount,

  deny /sys/[^f]*/** wklx,
  deny /sys/f[^s]*/** wklx,
  deny /sys/fs/[^c]*/** wklx,
  deny /sys/fs/c[^g]*/** wklx,
  deny /sys/fs/cg[^r]*/** wklx,
  deny /sys/firmware/** rwklx,
  deny /sys/devices/virtual/powercap/** rwklx,
  deny /sys/kernel/security/** rwklx,

  # allow processes within the container to trace each other,
  # provided all other LSM and yama setting allow it.
  ptrace (trace,tracedby,read,readby) peer=` + p.name + `,
}
`)
	return b.String()
}
