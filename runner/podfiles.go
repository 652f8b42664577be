package runner

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
)

// The kubelet's limits on resolv.conf contents.
const (
	maxNameservers = 3
	maxSearches    = 32
)

// SandboxFiles are the plain files noderun keeps in a sandbox's run dir
// beside its pinned namespaces: the epoch, and the pod files where noderun
// versions before the pod files' tmpfs wrote them. Whoever removes a
// leftover sandbox dir removes them and RemovePodFiles (and nothing it does
// not know).
var SandboxFiles = []string{epochFile, hostsName, hostnameName, resolvName}

// The pod files' names in their dir.
const (
	hostsName    = "hosts"
	hostnameName = "hostname"
	resolvName   = "resolv.conf"
)

// PodFilesDir holds a sandbox's pod files and its containers' termination
// messages: with Config.PodTmpfs a tmpfs of the pod's own, so that a
// container writing into its /etc/hosts or message file fills that, not
// the host's /run or /var/lib (the kubelet keeps them on disk, where its
// eviction counts them; noderun has no eviction).
func PodFilesDir(sandboxDir string) string { return filepath.Join(sandboxDir, "files") }

func (w *podWorker) podFilesDir() string { return PodFilesDir(w.podRunDir()) }

// podFilesSlack is the room the pod files' tmpfs has beyond the files
// noderun writes: for the termination messages (the kubelet reads 4 KiB
// of each) and for writes into /etc/hosts, which stays writable as under
// the kubelet. A write past it gets ENOSPC; what a container writes there
// is charged to its memory cgroup, as any tmpfs write.
const podFilesSlack = 1 << 20

// ensurePodFiles makes the pod files' dir and, with Config.PodTmpfs,
// mounts its tmpfs, with room for need bytes of noderun's files beside
// the slack: a mounted one that is too small for them (a hostNetwork pod
// copies the host's /etc/hosts, which can be large) is grown in place.
// Workers of one pod may call it at once (precreate writes the files while
// configs create message files).
func (w *podWorker) ensurePodFiles(need int64) error {
	w.filesMu.Lock()
	defer w.filesMu.Unlock()
	dir := w.podFilesDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if !w.env.cfg.PodTmpfs {
		return nil
	}
	page := int64(os.Getpagesize())
	size := (need + podFilesSlack + page - 1) / page * page
	flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
	mounted, err := mountinfo.Mounted(dir)
	if err != nil {
		return err
	}
	if !mounted {
		if err := unix.Mount("noderun-pod", dir, "tmpfs", flags, "mode=0755,size="+strconv.FormatInt(size, 10)); err != nil {
			return fmt.Errorf("mount the pod files' tmpfs on %s: %w", dir, err)
		}
		return nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return err
	}
	if st.Type != unix.TMPFS_MAGIC {
		return fmt.Errorf("%s is mounted but not the pod files' tmpfs", dir)
	}
	if int64(st.Blocks)*int64(st.Bsize) >= size {
		return nil
	}
	if err := unix.Mount("", dir, "", flags|unix.MS_REMOUNT, "size="+strconv.FormatInt(size, 10)); err != nil {
		return fmt.Errorf("grow the pod files' tmpfs on %s: %w", dir, err)
	}
	return nil
}

// RemovePodFiles unmounts the pod files' tmpfs of the sandbox whose run dir
// is sandboxDir, then removes the dir; idempotent. It unmounts nothing but
// that tmpfs, which holds no mounts.
func RemovePodFiles(sandboxDir string) error {
	dir := PodFilesDir(sandboxDir)
	for {
		mounted, err := mountinfo.Mounted(dir)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if !mounted {
			break
		}
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmount %s: %w", dir, err)
		}
	}
	return os.RemoveAll(dir)
}

// writePodFiles writes the pod's /etc/hosts, /etc/hostname and
// /etc/resolv.conf, which every container bind-mounts. Files are rewritten
// in place only when their content changes, so running containers keep them.
func (w *podWorker) writePodFiles(pod *v1.Pod, dns DNSConfig) error {
	if pod.Spec.DNSPolicy == v1.DNSClusterFirst && !pod.Spec.HostNetwork || pod.Spec.DNSPolicy == v1.DNSClusterFirstWithHostNet {
		w.env.log.Warn("no cluster DNS on a standalone node; using the host's resolv.conf (dnsPolicy Default)", "pod", podRef(pod))
	}
	return w.writePodFileData(pod, dns)
}

// writePodFileData writes the pod files without a word. They live in the
// pod's run dir, beside its pinned namespaces, on the pod's own tmpfs
// (PodFilesDir): a pod start writes no disk, and a reboot, which ends every
// container that mounts them, takes them too; each sandbox start writes
// them again.
func (w *podWorker) writePodFileData(pod *v1.Pod, dns DNSConfig) error {
	if err := os.MkdirAll(w.podRunDir(), 0o700); err != nil {
		return err
	}
	resolv := renderResolvConf(dns)
	hostname := utsHostname(pod)
	hosts, err := hostsFile(pod, w.st.ips)
	if err != nil {
		return err
	}
	files := map[string][]byte{hostsName: hosts, hostnameName: []byte(hostname + "\n"), resolvName: resolv}
	var need int64
	for _, data := range files {
		need += int64(len(data)) + int64(os.Getpagesize()) // a file takes whole pages
	}
	if err := w.ensurePodFiles(need); err != nil {
		return err
	}
	dir := w.podFilesDir()
	for name, data := range files {
		if err := writeIfChanged(filepath.Join(dir, name), data); err != nil {
			return err
		}
	}
	return nil
}

func writeIfChanged(path string, data []byte) error {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return nil
	}
	return os.WriteFile(path, data, 0o644)
}

// utsHostname is the hostname a pod's containers see (the UTS name,
// /etc/hostname, $HOSTNAME): the pod's own, or the node's for hostNetwork
// pods (which share the host's UTS namespace).
func utsHostname(pod *v1.Pod) string {
	if pod.Spec.HostNetwork {
		h, _ := os.Hostname()
		return h
	}
	name, _ := kernelHostname(pod) // an error stops the sandbox first
	return name
}

// clusterDomain completes a subdomain's names; noderun has no cluster DNS
// and uses Kubernetes' default domain.
const clusterDomain = "cluster.local"

// podDomain is "<subdomain>.<namespace>.svc.<cluster domain>" for a pod with
// a subdomain, else empty, as the kubelet makes it; a hostnameOverride
// leaves the pod no domain.
func podDomain(pod *v1.Pod) string {
	if pod.Spec.Subdomain == "" || pod.Spec.HostnameOverride != nil {
		return ""
	}
	return fmt.Sprintf("%s.%s.svc.%s", pod.Spec.Subdomain, pod.Namespace, clusterDomain)
}

// maxKernelHostname is the kernel's limit on a UTS name.
const maxKernelHostname = 64

// kernelHostname is the name the kubelet gives the pod's sandbox: its
// hostname, or with setHostnameAsFQDN and a subdomain its FQDN, which must
// fit the kernel's 64 characters (the kubelet's error otherwise).
func kernelHostname(pod *v1.Pod) (string, error) {
	name := podHostname(pod)
	fqdn := pod.Spec.SetHostnameAsFQDN != nil && *pod.Spec.SetHostnameAsFQDN
	if d := podDomain(pod); fqdn && d != "" {
		name += "." + d
		if len(name) > maxKernelHostname {
			return name, fmt.Errorf("failed to construct FQDN from pod hostname and cluster domain, FQDN %s is too long (%d characters is the max, %d characters requested)",
				name, maxKernelHostname, len(name))
		}
	}
	return name, nil
}

// podHostname is spec.hostnameOverride, spec.hostname or the pod name, cut
// to 63 characters as the kubelet does (GeneratePodHostNameAndDomain).
func podHostname(pod *v1.Pod) string {
	h := pod.Spec.Hostname
	if h == "" {
		h = pod.Name
	}
	if o := pod.Spec.HostnameOverride; o != nil {
		h = *o
	}
	if len(h) > 63 {
		h = strings.TrimRight(h[:63], "-.")
	}
	return h
}

// hostsFile follows the kubelet: a managed file with localhost entries, the
// pod's own IPs and hostAliases; hostNetwork pods get the host's file plus
// their aliases.
func hostsFile(pod *v1.Pod, ips []string) ([]byte, error) {
	var b bytes.Buffer
	if pod.Spec.HostNetwork {
		host, err := os.ReadFile("/etc/hosts")
		if err != nil && !os.IsNotExist(err) {
			return nil, err
		}
		b.WriteString("# Kubernetes-managed hosts file (host network).\n")
		b.Write(host)
	} else {
		b.WriteString("# Kubernetes-managed hosts file.\n" +
			"127.0.0.1\tlocalhost\n" +
			"::1\tlocalhost ip6-localhost ip6-loopback\n" +
			"fe00::0\tip6-localnet\n" +
			"fe00::0\tip6-mcastprefix\n" +
			"fe00::1\tip6-allnodes\n" +
			"fe00::2\tip6-allrouters\n")
		name := podHostname(pod)
		if d := podDomain(pod); d != "" {
			name = name + "." + d + "\t" + name
		}
		for _, ip := range ips {
			fmt.Fprintf(&b, "%s\t%s\n", ip, name)
		}
	}
	if len(pod.Spec.HostAliases) > 0 {
		b.WriteString("\n# Entries added by HostAliases.\n")
		for _, a := range pod.Spec.HostAliases {
			fmt.Fprintf(&b, "%s\t%s\n", a.IP, strings.Join(a.Hostnames, "\t"))
		}
	}
	return b.Bytes(), nil
}

// resolvConfig works out the pod's resolver settings from dnsPolicy and
// dnsConfig, with the kubelet's limits. Without cluster DNS, ClusterFirst
// behaves as Default.
func resolvConfig(pod *v1.Pod, hostResolv string) (DNSConfig, error) {
	var d DNSConfig
	if pod.Spec.DNSPolicy != v1.DNSNone {
		var err error
		d.Servers, d.Searches, d.Options, err = parseResolvConf(hostResolv)
		if err != nil {
			return d, err
		}
	}
	if c := pod.Spec.DNSConfig; c != nil {
		d.Servers = appendUnique(d.Servers, c.Nameservers...)
		d.Searches = appendUnique(d.Searches, c.Searches...)
		for _, o := range c.Options {
			d.Options = setOption(d.Options, o)
		}
	}
	d.Servers = d.Servers[:min(len(d.Servers), maxNameservers)]
	d.Searches = d.Searches[:min(len(d.Searches), maxSearches)]
	return d, nil
}

func renderResolvConf(d DNSConfig) []byte {
	var b bytes.Buffer
	for _, n := range d.Servers {
		fmt.Fprintf(&b, "nameserver %s\n", n)
	}
	if len(d.Searches) > 0 {
		fmt.Fprintf(&b, "search %s\n", strings.Join(d.Searches, " "))
	}
	if len(d.Options) > 0 {
		fmt.Fprintf(&b, "options %s\n", strings.Join(d.Options, " "))
	}
	return b.Bytes()
}

func parseResolvConf(path string) (ns, search, opts []string, err error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil, nil, nil, nil
	} else if err != nil {
		return nil, nil, nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 || strings.HasPrefix(fields[0], "#") || strings.HasPrefix(fields[0], ";") {
			continue
		}
		switch fields[0] {
		case "nameserver":
			ns = append(ns, fields[1])
		case "search", "domain":
			search = fields[1:]
		case "options":
			opts = append(opts, fields[1:]...)
		}
	}
	return ns, search, opts, sc.Err()
}

func appendUnique(list []string, add ...string) []string {
	for _, a := range add {
		if !slices.Contains(list, a) {
			list = append(list, a)
		}
	}
	return list
}

// setOption adds or replaces a resolver option such as ndots:5.
func setOption(opts []string, o v1.PodDNSConfigOption) []string {
	s := o.Name
	if o.Value != nil {
		s += ":" + *o.Value
	}
	for i, old := range opts {
		if name, _, _ := strings.Cut(old, ":"); name == o.Name {
			opts[i] = s
			return opts
		}
	}
	return append(opts, s)
}

// podFileMounts bind-mounts the pod files unless the container mounts its
// own at the same place. With readOnlyRootFilesystem, /etc/hostname and
// /etc/resolv.conf are read-only, as CRI binds them; /etc/hosts stays
// writable, as the kubelet's own etc-hosts mount is.
// The pod's /dev/shm is shared by its containers too: the pod's own tmpfs,
// or the host's with hostIPC.
func (w *podWorker) podFileMounts(pod *v1.Pod, c *v1.Container) []Mount {
	shm := w.sandbox(pod).ShmPath()
	if pod.Spec.HostIPC {
		shm = "/dev/shm"
	}
	roRoot := c.SecurityContext != nil && c.SecurityContext.ReadOnlyRootFilesystem != nil && *c.SecurityContext.ReadOnlyRootFilesystem
	dir := w.podFilesDir()
	var out []Mount
	for _, f := range []Mount{
		{Source: filepath.Join(dir, hostsName), Destination: "/etc/hosts"},
		{Source: filepath.Join(dir, hostnameName), Destination: "/etc/hostname", ReadOnly: roRoot},
		{Source: filepath.Join(dir, resolvName), Destination: "/etc/resolv.conf", ReadOnly: roRoot},
		{Source: shm, Destination: "/dev/shm"},
	} {
		if !slices.ContainsFunc(c.VolumeMounts, func(m v1.VolumeMount) bool { return m.MountPath == f.Destination }) {
			out = append(out, f)
		}
	}
	return out
}
