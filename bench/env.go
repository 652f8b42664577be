package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"
	"github.com/containernetworking/cni/libcni"
	"golang.org/x/sys/unix"

	"github.com/noderun/noderun/cni"
	"github.com/noderun/noderun/internal/ociimage"
	"github.com/noderun/noderun/internal/testnode"
	ctrddaemon "github.com/noderun/noderun/runner/containerd/daemon"
)

const (
	snapshotter = "overlayfs" // what noderun uses
	imageRef    = "docker.io/library/busybox:1.36"
	floorNS     = "nrbench-floor"
	noderunNS   = "nrbench-noderun"
	cleanupTime = 2 * time.Minute
)

// missingPrerequisite names the first thing the bench cannot run without,
// or returns "": a node's, and what diskState needs.
func missingPrerequisite() string { return testnode.MissingPrerequisite("mkfs.ext4", "mount") }

// env is everything the bench runs on: one temp dir holding the noderun
// binary, the image tarball, a private containerd and the CNI config.
type env struct {
	cfg      Config
	releases []func() // the claims on the bridges' names, dropped last
	dir      string
	img      string // the filesystem image mounted on dir, if any
	bin      string // stripped noderun binary
	driver   string // the log driver it embeds, which the floor runs too
	imageTar string
	cniConf  string // the floor's conflist
	// noderun writes its own default config (the floor's chain) for a
	// bridge of its own (the bridge plugin keeps one subnet per bridge) and
	// the other half of the subnet, so that it may run only the plugins
	// each pod needs, as it does for users.
	nodeCNIDir, nodeSubnet, nodeBridge string
	floorSubnet                        string
	daemon                             *ctrddaemon.Process
	client                             *containerd.Client
}

func newEnv(ctx context.Context, cfg Config) (e *env, retErr error) {
	var releases []func()
	defer func() {
		if retErr != nil && e == nil {
			for _, r := range releases {
				r()
			}
		}
	}()
	for _, br := range []string{cfg.Bridge, nodeBridgeName(cfg.Bridge)} {
		release, ok, err := testnode.ClaimNetwork(br)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("bridge %s: another run on this machine uses it", br)
		}
		releases = append(releases, release)
		if err := testnode.NetworkFree(br, cfg.Subnet); err != nil {
			return nil, err
		}
	}
	// Under /tmp and short: containerd's socket path must fit sun_path.
	dir, err := os.MkdirTemp("/tmp", "nrb")
	if err != nil {
		return nil, err
	}
	e = &env{cfg: cfg, dir: dir, releases: releases}
	defer func() {
		if retErr != nil {
			retErr = errors.Join(retErr, e.close())
		}
	}()
	if !cfg.StateOnHostFS {
		if err := e.diskState(ctx); err != nil {
			return e, err
		}
	}
	e.bin, e.driver = filepath.Join(dir, "noderun"), filepath.Join(dir, "log-driver")
	if err := buildNoderun(ctx, e.bin, e.driver); err != nil {
		return e, err
	}
	img, err := ociimage.Busybox(imageRef)
	if err != nil {
		return e, err
	}
	e.imageTar = filepath.Join(dir, "busybox.tar")
	if err := ociimage.WriteFile(e.imageTar, img); err != nil {
		return e, err
	}
	floorSubnet, nodeSubnet, err := halves(cfg.Subnet)
	if err != nil {
		return e, err
	}
	e.floorSubnet = floorSubnet
	e.nodeSubnet, e.nodeCNIDir, e.nodeBridge = nodeSubnet, filepath.Join(dir, "node", "cni"), nodeBridgeName(cfg.Bridge)
	e.cniConf = filepath.Join(dir, "cni", "10-nrbench.conflist")
	if err := writeCNIConfig(e.cniConf, cfg.Bridge, floorSubnet, filepath.Join(dir, "floor", "cni")); err != nil {
		return e, err
	}
	if err := e.runState(filepath.Join(dir, "ctrd", "state")); err != nil {
		return e, err
	}
	e.daemon, e.client, err = testnode.StartContainerd(ctx, filepath.Join(dir, "ctrd", "root"), filepath.Join(dir, "ctrd", "state"),
		filepath.Join(dir, "c.sock"), filepath.Join(dir, "containerd.log"))
	return e, err
}

// runState makes dir a tmpfs for run-time state, as /run is on a normal
// host (and containerd's state, runc's root and noderun's --run-dir live
// there by default). On a root filesystem such as this VM's ext4 without a
// journal, each file made there costs an inode allocation that grows
// dearer with churn (recently freed inodes are skipped one by one), which
// a host's /run never pays. Both sides get the same. close unmounts it.
func (e *env) runState(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if e.cfg.RunStateOnDisk {
		return nil
	}
	ms, err := testnode.MountsUnder(dir)
	if err != nil {
		return err
	}
	if slices.ContainsFunc(ms, func(m testnode.Mount) bool { return m.Point == dir }) {
		return nil // a node started again in its dir keeps its run-time state, as on a host
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
		return fmt.Errorf("mount tmpfs on %s: %w", dir, err)
	}
	return nil
}

// diskState puts the bench dir on an ext4 of its own, made with a journal
// on a sparse file beside it, as a host's /var/lib usually is. Without a
// journal (this VM's root filesystem) ext4 skips, at every inode it
// allocates, the inodes freed in the last 30 s one by one, so each file
// made on it costs more the more the bench removed lately, and the side
// that keeps more files on disk pays more: a cost of this machine, not of
// the work. Its inode tables are written at mkfs, not by the kernel in the
// background while the bench runs. close unmounts it and removes the file.
func (e *env) diskState(ctx context.Context) error {
	img := e.dir + ".img"
	f, err := os.Create(img)
	if err != nil {
		return err
	}
	e.img = img
	err = errors.Join(f.Truncate(8<<30), f.Close())
	if err != nil {
		return err
	}
	for _, args := range [][]string{
		{"mkfs.ext4", "-q", "-F", "-N", "262144", "-E", "lazy_itable_init=0,lazy_journal_init=0", img},
		{"mount", "-o", "loop", img, e.dir},
	} {
		if out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

// buildNoderun builds the module's main package as `make build` does, minus
// the version stamp, so the size measured is the shipped one: the log
// driver first, then noderun embedding it; a copy of the driver goes to
// driver, for the floor.
func buildNoderun(ctx context.Context, out, driver string) error {
	gomod, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return fmt.Errorf("go env GOMOD: %w", err)
	}
	drv, err := testnode.Build(ctx, filepath.Dir(strings.TrimSpace(string(gomod))), out, "-trimpath", "-ldflags", "-s -w")
	if err != nil {
		return err
	}
	return os.WriteFile(driver, drv, 0o755)
}

// nodeBridgeName is the bridge of noderun's network: the floor's name with
// an "n", within the 15 characters of an interface name.
func nodeBridgeName(bridge string) string {
	return bridge[:min(len(bridge), 14)] + "n"
}

// halves splits a subnet into its lower and upper half.
func halves(subnet string) (lower, upper string, err error) {
	p, err := netip.ParsePrefix(subnet)
	if err != nil || !p.Addr().Is4() || p.Bits() > 29 {
		return "", "", fmt.Errorf("subnet %q: want IPv4 with room for two halves", subnet)
	}
	p = p.Masked()
	a := p.Addr().As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	v += 1 << (31 - p.Bits())
	up := netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	return netip.PrefixFrom(p.Addr(), p.Bits()+1).String(), netip.PrefixFrom(up, p.Bits()+1).String(), nil
}

// writeCNIConfig writes noderun's default config, the whole chain (bridge
// with masquerade and hairpin, host-local, portmap, bandwidth, loopback), for
// the floor's bridge and subnet, with its leases under cacheDir's parent.
// Built by noderun's own code, so the floor cannot drift from the chain it
// stands for.
func writeCNIConfig(path, bridge, subnet, cacheDir string) error {
	b, err := cni.DefaultConfig(cni.Config{DefaultBridge: bridge, DefaultSubnet: subnet, CacheDir: cacheDir})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// close removes everything the bench made, whatever state a failure left:
// containers and tasks in both namespaces, CNI attachments and pinned
// namespaces, mounts, the floor's cgroups, containerd (by its PID), the bridge
// and the temp dir.
func (e *env) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTime)
	defer cancel()
	var errs []error
	if e.client != nil {
		for _, ns := range []string{floorNS, noderunNS} {
			errs = append(errs, testnode.RemoveContainers(namespaces.WithNamespace(ctx, ns), e.client))
		}
	}
	errs = append(errs,
		detachLeftovers(ctx, e.cniConf, filepath.Join(e.dir, "floor", "cni"), filepath.Join(e.dir, "floor", "pods")),
		detachLeftovers(ctx, filepath.Join(e.nodeCNIDir, "10-noderun.conflist"), filepath.Join(e.dir, "node", "state", "cni", "cache"), filepath.Join(e.dir, "node", "run", "pods")))
	removeCgroup(floorCgroup(e.dir))
	// noderun's network is named after its bridge, not the default one.
	errs = append(errs, cni.RemoveMasquerade(ctx, nodeBridgeName(e.cfg.Bridge)))
	if e.client != nil {
		errs = append(errs, e.client.Close())
	}
	if e.daemon != nil {
		errs = append(errs, e.daemon.Stop(ctx))
	}
	errs = append(errs, testnode.UnmountUnder(e.dir))
	for _, br := range []string{e.cfg.Bridge, nodeBridgeName(e.cfg.Bridge)} {
		if _, err := net.InterfaceByName(br); err == nil {
			if out, err := exec.Command("ip", "link", "del", br).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("ip link del %s: %w: %s", br, err, out))
			}
		}
	}
	errs = append(errs, os.RemoveAll(e.dir))
	if e.img != "" {
		errs = append(errs, os.Remove(e.img))
	}
	for _, release := range e.releases {
		release()
	}
	return errors.Join(errs...)
}

// detachLeftovers releases the CNI attachment (IP, iptables rules) and the
// pinned namespaces of every sandbox dir still under podsDir.
func detachLeftovers(ctx context.Context, conf, cacheDir, podsDir string) error {
	sandboxes, err := os.ReadDir(podsDir)
	if errors.Is(err, os.ErrNotExist) || len(sandboxes) == 0 {
		return nil
	}
	if err != nil {
		return err
	}
	list, err := libcni.ConfListFromFile(conf)
	if err != nil {
		return err
	}
	plugins := libcni.NewCNIConfigWithCacheDir([]string{testnode.CNIBinDir}, cacheDir, nil)
	var errs []error
	for _, sb := range sandboxes {
		dir := filepath.Join(podsDir, sb.Name())
		rt := &libcni.RuntimeConf{ContainerID: sb.Name(), NetNS: filepath.Join(dir, "net"), IfName: "eth0"}
		if err := plugins.DelNetworkList(ctx, list, rt); err != nil {
			errs = append(errs, fmt.Errorf("CNI DEL %s: %w", sb.Name(), err))
		}
		errs = append(errs, cni.RemoveNamespaces(dir, nil))
		for _, tier := range []string{"", "/burstable", "/besteffort"} { // noderun's pod cgroup, if it was noderun's
			removeCgroup("/noderun" + tier + "/pod" + sb.Name())
		}
	}
	return errors.Join(errs...)
}

// removeCgroup removes a cgroup dir (empty by now) from every hierarchy, as
// noderun does with its pod cgroups.
func removeCgroup(path string) {
	ms, _ := testnode.MountsUnder("/")
	for _, m := range ms {
		if m.FSType == "cgroup" || m.FSType == "cgroup2" {
			_ = unix.Rmdir(filepath.Join(m.Point, path))
		}
	}
}
