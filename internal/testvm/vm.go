package testvm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"
)

// The machine's size: the 2 vCPUs and 2 GiB.
const (
	cpus     = "2"
	memoryMB = "2048"
)

// VM is one machine on an image: its disk is a qcow2 overlay of the
// image's, in a directory of the test's, so each test starts from the
// image as built and its power cuts leave the image alone.
type VM struct {
	img *Image
	dir string
	// Accel is "kvm" or "tcg", as chosen at New.
	Accel string
	// KernelArgs are added to the image's kernel command line at each
	// Boot (e.g. systemd.unified_cgroup_hierarchy=0 for cgroup v1).
	KernelArgs []string
	qemu       *exec.Cmd
	exited     chan struct{}
	client     *ssh.Client
}

// New makes a machine whose disk lives in dir; nothing runs yet.
func (img *Image) New(ctx context.Context, dir string) (*VM, error) {
	disk := filepath.Join(dir, "disk.qcow2")
	out, err := exec.CommandContext(ctx, "qemu-img", "create", "-q", "-f", "qcow2",
		"-b", filepath.Join(img.Dir, "disk.raw"), "-F", "raw", disk).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("qemu-img create: %w: %s", err, out)
	}
	accel := "tcg"
	if kvmWorks() {
		accel = "kvm"
	}
	return &VM{img: img, dir: dir, Accel: accel}, nil
}

// kvmWorks reports whether this host can run a KVM guest: /dev/kvm may
// exist, and even make VMs, where the CPU does not offer its
// virtualisation (vmx, svm) to this kernel: a nested guest whose KVM
// guests then hang before their first console line.
func kvmWorks() bool {
	cpuinfo, err := os.ReadFile("/proc/cpuinfo")
	if err != nil || !regexp.MustCompile(`(?m)^flags\s*:.*\b(vmx|svm)\b`).Match(cpuinfo) {
		return false
	}
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	const kvmCreateVM = 0xAE01
	vm, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), kvmCreateVM, 0)
	if errno != 0 {
		return false
	}
	unix.Close(int(vm))
	return true
}

// Boot starts qemu and returns once ssh logs in, bounded by ctx. The
// kernel's console goes to console.log in the machine's dir (appended
// across boots).
func (vm *VM) Boot(ctx context.Context) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	cpu := "max"
	if vm.Accel == "kvm" {
		cpu = "host"
	}
	cmdline, err := os.ReadFile(filepath.Join(vm.img.Dir, "cmdline"))
	if err != nil {
		return err
	}
	args := strings.Join(append(strings.Fields(string(cmdline)), vm.KernelArgs...), " ")
	console, err := os.OpenFile(filepath.Join(vm.dir, "console.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer console.Close()
	// restrict=on: the guest reaches nothing; only the forwarded port
	// reaches it.
	vm.qemu = exec.Command("qemu-system-x86_64", "-nodefaults", "-no-user-config", "-display", "none",
		"-machine", "q35", "-accel", vm.Accel, "-cpu", cpu, "-smp", cpus, "-m", memoryMB,
		"-kernel", filepath.Join(vm.img.Dir, "vmlinuz"), "-initrd", filepath.Join(vm.img.Dir, "initrd.img"),
		"-append", args,
		"-drive", "file="+filepath.Join(vm.dir, "disk.qcow2")+",if=virtio,format=qcow2",
		"-netdev", fmt.Sprintf("user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:%d-:22", port),
		"-device", "virtio-net-pci,netdev=n0", "-device", "virtio-rng-pci",
		"-serial", "stdio")
	vm.qemu.Stdout, vm.qemu.Stderr = console, console
	vm.qemu.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := vm.qemu.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	vm.exited = exited
	go func() { vm.qemu.Wait(); close(exited) }()
	return vm.dial(ctx, port)
}

// dial retries ssh until the guest's sshd answers: before then qemu
// accepts the forwarded connection and drops it.
func (vm *VM) dial(ctx context.Context, port int) error {
	cfg := &ssh.ClientConfig{User: "root", Auth: []ssh.AuthMethod{ssh.PublicKeys(vm.img.signer)},
		HostKeyCallback: ssh.FixedHostKey(vm.img.hostKey), Timeout: 20 * time.Second,
		// The key the image recorded, not the RSA one sshd offers first.
		HostKeyAlgorithms: []string{vm.img.hostKey.Type()}}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		c, err := ssh.Dial("tcp", addr, cfg)
		if err == nil {
			vm.client = c
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("ssh to the machine (console: %s): %w (last: %v)", filepath.Join(vm.dir, "console.log"), ctx.Err(), err)
		case <-vm.exited:
			return fmt.Errorf("qemu exited before ssh answered: %v (console: %s)", vm.qemu.ProcessState, filepath.Join(vm.dir, "console.log"))
		case <-tick.C:
		}
	}
}

// freePort is a loopback port free now, for qemu's forward.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Run runs a shell script as root in the machine and returns its output
// (stdout, then stderr); a non-zero exit is an error naming the script.
// ctx ends the session.
func (vm *VM) Run(ctx context.Context, script string) (string, error) {
	return vm.RunInput(ctx, script, nil)
}

// RunInput is Run with stdin.
func (vm *VM) RunInput(ctx context.Context, script string, stdin []byte) (string, error) {
	if vm.client == nil {
		return "", errors.New("the machine is not up")
	}
	s, err := vm.client.NewSession()
	if err != nil {
		return "", err
	}
	defer s.Close()
	var stdout, stderr bytes.Buffer
	s.Stdout, s.Stderr = &stdout, &stderr
	if stdin != nil {
		s.Stdin = bytes.NewReader(stdin)
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(script) }()
	select {
	case err = <-done:
	case <-ctx.Done():
		s.Close()
		err = ctx.Err()
	}
	out := stdout.String() + stderr.String()
	if err != nil {
		return out, fmt.Errorf("in the machine: %q: %w\n%s", script, err, out)
	}
	return out, nil
}

// WriteFile writes data to path in the machine, through a temporary file
// renamed into place and synced, so that a power cut leaves either all of
// it or none.
func (vm *VM) WriteFile(ctx context.Context, path string, data []byte, mode os.FileMode) error {
	tmp := path + ".vmtmp"
	_, err := vm.RunInput(ctx, fmt.Sprintf("set -e; mkdir -p %q; cat > %q; chmod %o %q; sync %q; mv %q %q; sync -f %q",
		filepath.Dir(path), tmp, mode, tmp, tmp, tmp, path, filepath.Dir(path)), data)
	return err
}

// Dial connects to an address in the machine through ssh: a unix socket
// ("unix") or a TCP port on its loopback ("tcp").
func (vm *VM) Dial(network, addr string) (net.Conn, error) {
	if vm.client == nil {
		return nil, errors.New("the machine is not up")
	}
	return vm.client.Dial(network, addr)
}

// PowerCut kills qemu at once: the guest's caches and every write qemu
// was not told to flush are lost, as in a power cut.
func (vm *VM) PowerCut() error {
	if vm.qemu == nil || vm.qemu.Process == nil {
		return errors.New("the machine is not running")
	}
	if vm.client != nil {
		vm.client.Close()
		vm.client = nil
	}
	if err := vm.qemu.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	<-vm.exited
	return nil
}

// Poweroff shuts the machine down as its operator would (systemctl
// poweroff) and waits, bounded by ctx, for qemu to exit.
func (vm *VM) Poweroff(ctx context.Context) error {
	if vm.client == nil {
		return errors.New("the machine is not up")
	}
	// The session ends with the machine; its error says nothing.
	vm.Run(ctx, "systemctl poweroff --no-block")
	select {
	case <-vm.exited:
		vm.client.Close()
		vm.client = nil
		return nil
	case <-ctx.Done():
		return fmt.Errorf("systemctl poweroff: the machine still runs: %w", ctx.Err())
	}
}

// Close kills qemu if it still runs.
func (vm *VM) Close() {
	if vm.exited == nil {
		return
	}
	select {
	case <-vm.exited:
	default:
		vm.PowerCut()
	}
}
