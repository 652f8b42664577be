package testnode

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/noderun/noderun/internal/logdriver"
	"github.com/noderun/noderun/internal/ociimage"
	"golang.org/x/sys/unix"
)

// CNIBinDir holds the CNI plugins a node under test runs.
const CNIBinDir = "/usr/lib/cni"

// MissingPrerequisite names the first thing a node cannot run without
// (root, binaries in PATH, with extraBins, the CNI plugins of noderun's
// default chain, the static busybox images are built from), or returns "".
func MissingPrerequisite(extraBins ...string) string {
	if os.Geteuid() != 0 {
		return "root"
	}
	bins := append([]string{"containerd", "containerd-shim-runc-v2", "runc", "ip", "iptables", "go"}, extraBins...)
	for _, bin := range bins {
		if _, err := exec.LookPath(bin); err != nil {
			return bin + " in PATH"
		}
	}
	for _, f := range []string{"bridge", "host-local", "portmap", "bandwidth", "loopback"} {
		if _, err := os.Stat(filepath.Join(CNIBinDir, f)); err != nil {
			return "CNI plugin " + filepath.Join(CNIBinDir, f)
		}
	}
	if _, err := os.Stat(ociimage.BusyboxPath); err != nil {
		return "static busybox at " + ociimage.BusyboxPath
	}
	return ""
}

// Build builds noderun from the module at root to out as the Makefile
// does, the log driver first and then noderun embedding it, with goFlags
// added to `go build`; it returns the driver.
func Build(ctx context.Context, root, out string, goFlags ...string) ([]byte, error) {
	driver, err := logdriver.Build(ctx, root)
	if err != nil {
		return nil, err
	}
	args := append([]string{"build", "-tags", "grpcnotrace,urfave_cli_no_docs,noderun_logdriver"}, goFlags...)
	cmd := exec.CommandContext(ctx, "go", append(args, "-o", out, ".")...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build noderun: %w\n%s", err, b)
	}
	return driver, nil
}

// NetworkFree refuses a bridge that exists (another node's, or one left by
// a killed run) or a subnet the host already routes.
func NetworkFree(bridge, subnet string) error {
	if _, err := net.InterfaceByName(bridge); err == nil {
		return fmt.Errorf("bridge %s exists: another run uses it, or remove it with `ip link del %s`", bridge, bridge)
	}
	_, want, err := net.ParseCIDR(subnet)
	if err != nil {
		return err
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return err
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && (want.Contains(ipn.IP) || ipn.Contains(want.IP)) {
			return fmt.Errorf("subnet %s overlaps the host's %s", subnet, ipn)
		}
	}
	return nil
}

// ClaimNetwork claims bridge's name for this process until release: a
// bridge exists only once its node's first pod is set up, so two test
// processes on one machine could otherwise both find a name free, and the
// first to finish would delete the other's bridge. The claim is a flock,
// which the kernel drops if the process dies. ok is false when another
// process holds it.
func ClaimNetwork(bridge string) (release func(), ok bool, err error) {
	dir := filepath.Join(os.TempDir(), "noderun-test-networks")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, false, err
	}
	f, err := os.OpenFile(filepath.Join(dir, bridge), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, false, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, err
	}
	return func() { f.Close() }, true, nil
}
