package main

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"time"

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
	httpPod := func(c *v1.Container) {
		// busybox httpd serves /tmp/index.html; it ends on SIGTERM.
		c.Command = []string{"sh", "-c", "echo ok > /tmp/index.html; exec httpd -f -p 8080 -h /tmp"}
		c.ReadinessProbe = &v1.Probe{PeriodSeconds: 1, ProbeHandler: v1.ProbeHandler{
			HTTPGet: &v1.HTTPGetAction{Path: "/", Port: intstr.FromInt32(8080)}}}
	}
	execPod := func(c *v1.Container) {
		c.LivenessProbe = &v1.Probe{PeriodSeconds: 10, ProbeHandler: v1.ProbeHandler{
			Exec: &v1.ExecAction{Command: []string{"true"}}}}
	}
	for _, phase := range []struct {
		prefix    string
		mutate    func(*v1.Container)
		cpu, host *float64
	}{
		{"hp", httpPod, &b.m.probeHTTPCPU, &b.m.probeHTTPHost},
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
