package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// probeCPU measures what probes cost: noderun's CPU (and the whole host's)
// with ProbePods pods each probed for readiness by httpGet every second,
// then with as many probed for liveness by exec every 10 s. noderun makes
// httpGet probes itself; an exec probe is a process started in the
// container through containerd, runc and the shim, which is where the
// kubelet spends most of its probe CPU.
func (b *bench) probeCPU(ctx context.Context) error {
	n := b.cfg.ProbePods
	execPod := func(c *v1.Container) {
		c.LivenessProbe = &v1.Probe{PeriodSeconds: 10, ProbeHandler: v1.ProbeHandler{
			Exec: &v1.ExecAction{Command: []string{"true"}}}}
	}
	for _, phase := range []struct {
		prefix    string
		mutate    func(*v1.Container)
		cpu, host *float64
	}{
		{"hp", httpProbed, &b.m.probeHTTPCPU, &b.m.probeHTTPHost},
		{"ep", execPod, &b.m.probeExecCPU, &b.m.probeExecHost},
	} {
		b.logf("%d pods with %s probes: CPU over %s", n, phase.prefix, b.cfg.CPUWindow)
		names := podNames(phase.prefix, n)
		if _, err := b.node.writeManifestsWith(names, phase.mutate); err != nil {
			return err
		}
		if err := b.node.waitReady(ctx, names, waitTimeout); err != nil {
			return err
		}
		if err := sleep(ctx, settle); err != nil {
			return err
		}
		cpu, host, err := b.cpuOver(ctx, b.cfg.CPUWindow)
		if err != nil {
			return err
		}
		*phase.cpu, *phase.host = cpu, host
		if phase.prefix == "hp" {
			if b.m.probeFloorCPU, err = b.probeFloor(ctx, names); err != nil {
				return err
			}
		}
		// Probes that failed would have shown as restarts or unready pods.
		if err := b.node.waitReady(ctx, names, 0); err != nil {
			return fmt.Errorf("after the CPU window: %w", err)
		}
		b.nw.drain()
		if _, err := b.node.removeManifests(names); err != nil {
			return err
		}
		if err := b.node.waitNoPods(ctx, waitTimeout); err != nil {
			return err
		}
	}
	b.m.probePods = n
	return nil
}

// httpProbed makes c serve HTTP and be probed for readiness by httpGet
// every second. busybox httpd serves /tmp/index.html; it ends on SIGTERM.
func httpProbed(c *v1.Container) {
	c.Command = []string{"sh", "-c", "echo ok > /tmp/index.html; exec httpd -f -p 8080 -h /tmp"}
	c.ReadinessProbe = &v1.Probe{PeriodSeconds: 1, ProbeHandler: v1.ProbeHandler{
		HTTPGet: &v1.HTTPGetAction{Path: "/", Port: intstr.FromInt32(8080)}}}
}

// cpuOver returns noderun's CPU and the host's busy share, both in percent
// of one core, over window.
func (b *bench) cpuOver(ctx context.Context, window time.Duration) (cpu, host float64, err error) {
	cpu0, err := b.node.cpuTime()
	if err != nil {
		return 0, 0, err
	}
	busy0, total0, err := hostCPU()
	if err != nil {
		return 0, 0, err
	}
	t0 := time.Now()
	if err := sleep(ctx, window); err != nil {
		return 0, 0, err
	}
	cpu1, err := b.node.cpuTime()
	if err != nil {
		return 0, 0, err
	}
	busy1, total1, err := hostCPU()
	if err != nil {
		return 0, 0, err
	}
	cores := float64(runtime.NumCPU())
	return 100 * float64(cpu1-cpu0) / float64(time.Since(t0)),
		100 * cores * float64(busy1-busy0) / float64(max(total1-total0, 1)), nil
}

// waitReady polls until every named pod is Ready with no restart; timeout
// 0 checks once.
func (n *node) waitReady(ctx context.Context, names []string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		pods, _, err := n.pods(ctx)
		if err != nil {
			return err
		}
		ok := 0
		for i := range pods {
			if slices.Contains(names, strings.TrimSuffix(pods[i].Name, "-"+nodeName)) && podReady(&pods[i]) {
				ok++
			}
		}
		if ok == len(names) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d pods Ready without restarts after %s", ok, len(names), timeout)
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
}

func podReady(p *v1.Pod) bool {
	for _, cs := range p.Status.ContainerStatuses {
		if cs.RestartCount > 0 {
			return false
		}
	}
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}

// probeFloor is the least CPU the same httpGet probes can cost: each a
// fresh TCP connection and one GET, made with blocking system calls on one
// locked thread (no runtime, no HTTP library), to the same pods, back to
// back. It returns what 100 of them a second cost, in percent of a core,
// scaled to the number of pods.
func (b *bench) probeFloor(ctx context.Context, names []string) (float64, error) {
	return b.rawProbes(ctx, names, 2000, 0)
}

// rawProbes makes n of probeFloor's probes, gap apart (slept in the
// kernel, the thread idle as an agent's is between probes).
func (b *bench) rawProbes(ctx context.Context, names []string, n int, gap time.Duration) (float64, error) {
	pods, _, err := b.node.pods(ctx)
	if err != nil {
		return 0, err
	}
	var ips [][4]byte
	for _, p := range pods {
		if ip := net.ParseIP(p.Status.PodIP).To4(); ip != nil && slices.Contains(names, strings.TrimSuffix(p.Name, "-"+nodeName)) {
			ips = append(ips, [4]byte(ip))
		}
	}
	if len(ips) == 0 {
		return 0, errors.New("probe floor: no pod IPs")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	t0, err := threadCPU()
	if err != nil {
		return 0, err
	}
	for i := range n {
		if err := rawGet(ips[i%len(ips)], 8080); err != nil {
			return 0, fmt.Errorf("probe floor: %w", err)
		}
		if gap > 0 {
			ts := unix.NsecToTimespec(gap.Nanoseconds())
			_ = unix.Nanosleep(&ts, nil)
		}
	}
	t1, err := threadCPU()
	if err != nil {
		return 0, err
	}
	perProbe := (t1 - t0) / time.Duration(n)
	return 100 * float64(perProbe) * float64(len(names)) / float64(time.Second), nil
}

func threadCPU() (time.Duration, error) {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		return 0, err
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

var rawRequest = []byte("GET / HTTP/1.1\r\nHost: pod\r\nUser-Agent: kube-probe/1.37\r\nAccept: */*\r\nConnection: close\r\n\r\n")

// rawGet connects, sends rawRequest and reads the status line.
func rawGet(ip [4]byte, port int) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	tv := unix.Timeval{Sec: 2}
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv)
	err = unix.Connect(fd, &unix.SockaddrInet4{Port: port, Addr: ip})
	for err == unix.EINTR {
		err = unix.Connect(fd, &unix.SockaddrInet4{Port: port, Addr: ip})
	}
	if err != nil && err != unix.EISCONN {
		return err
	}
	if _, err := unix.Write(fd, rawRequest); err != nil {
		return err
	}
	var buf [512]byte
	n, err := unix.Read(fd, buf[:])
	for err == unix.EINTR {
		n, err = unix.Read(fd, buf[:])
	}
	if err != nil {
		return err
	}
	if !bytes.HasPrefix(buf[:n], []byte("HTTP/1.")) {
		return fmt.Errorf("not an HTTP answer: %q", buf[:n])
	}
	return nil
}
