package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd"
	apievents "github.com/containerd/containerd/api/events"
	tasksapi "github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/typeurl/v2"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/cni"
	"github.com/noderun/noderun/internal/testnode"
)

// The peers bench's rows beyond start and removal (issue 40).
const (
	measureInit    = "pod with 3 init + 2 app containers: manifest → Ready, s"
	measureCrash   = "restart of a crashed container: exit → new process, s"
	measureReboot  = "reboot recovery of %d pods: agent started → all Ready, s"
	measureProbe   = "probe CPU, %d pods with an httpGet readiness probe every 1 s: %s, %% of a core"
	measureIdleCPU = "idle CPU at %d pods: %s, %% of a core"
)

// notMeasured records why system s has no figure for measure.
func (p *peers) notMeasured(measure, s, why string) {
	if p.na[measure] == nil {
		p.na[measure] = map[string]string{}
	}
	p.na[measure][s] = why
	if p.samples[measure] == nil {
		p.samples[measure] = map[string][]float64{}
	}
}

// cycle starts the pods on s (not the floor), shaped by spec if set, and
// returns the time from the manifests' appearance until the system's own
// API reported all Ready; whileUp runs once they settled, then they are
// removed. runs is each pod's containers, init containers included.
func (p *peers) cycle(ctx context.Context, s string, names []string, spec func(*v1.PodSpec), runs int, whileUp func() error) (time.Duration, error) {
	if err := sleep(ctx, settle); err != nil {
		return 0, err
	}
	if whileUp == nil {
		whileUp = func() error { return nil }
	}
	switch s {
	case sysNoderun:
		t0, err := p.node.writePods(names, func(ps *v1.PodSpec) {
			if spec != nil {
				spec(ps)
			}
		})
		if err != nil {
			return 0, err
		}
		at, err := p.node.waitReadyAt(ctx, names)
		if err != nil {
			return 0, err
		}
		if err := errors.Join(sleep(ctx, settle), whileUp()); err != nil {
			return 0, err
		}
		_, err = p.removeNodePods(ctx, names, runs*len(names))
		return at.Sub(t0), err
	case sysKubelet:
		t0, err := p.kube.writePods(names, spec)
		if err != nil {
			return 0, err
		}
		at, err := p.kube.waitPods(ctx, names, true)
		if err != nil {
			return 0, err
		}
		if err := errors.Join(sleep(ctx, settle), whileUp()); err != nil {
			return 0, err
		}
		_, err = p.kube.removePods(ctx, names)
		return at.Sub(t0), err
	case sysPodman:
		path, err := p.podman.writePods(names, spec)
		if err != nil {
			return 0, err
		}
		start, err := p.podman.play(ctx, path, len(names))
		if err != nil {
			// Not to be counted as another scenario's leftovers.
			_, rmErr := p.podman.run(context.WithoutCancel(ctx), append([]string{"pod", "rm", "-f", "-t", "0"}, names...)...)
			return 0, errors.Join(err, rmErr)
		}
		if err := errors.Join(sleep(ctx, settle), whileUp()); err != nil {
			return 0, err
		}
		_, err = p.podman.down(ctx, path)
		return start, err
	}
	return 0, fmt.Errorf("cycle: no such system %s", s)
}

// waitReadyAt polls noderun's status API until every named pod is
// Running and Ready (restarts allowed), and returns when the answer
// saying so arrived.
func (n *node) waitReadyAt(ctx context.Context, names []string) (time.Time, error) {
	deadline := time.Now().Add(waitTimeout)
	for {
		pods, at, err := n.pods(ctx)
		if err == nil && allOf(pods, names, nodeName, runningReady) {
			return at, nil
		}
		if time.Now().After(deadline) {
			return time.Time{}, errors.Join(err, fmt.Errorf("pods not Ready after %s", waitTimeout))
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return time.Time{}, err
		}
	}
}

// allOf tells whether every named pod is listed (as its static pod's
// name, <name>-<node>) and ok.
func allOf(pods []v1.Pod, names []string, node string, ok func(*v1.Pod) bool) bool {
	n := 0
	for i := range pods {
		if slices.Contains(names, strings.TrimSuffix(pods[i].Name, "-"+node)) && ok(&pods[i]) {
			n++
		}
	}
	return n == len(names)
}

// runningReady: phase Running and the Ready condition true.
func runningReady(p *v1.Pod) bool {
	if p.Status.Phase != v1.PodRunning {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}

// restartedReady: Ready again after a restart.
func restartedReady(p *v1.Pod) bool {
	return runningReady(p) && len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].RestartCount > 0
}

// initPodRun is the pod with init containers, once on s.
func (p *peers) initPodRun(ctx context.Context, s string, r int) error {
	name := fmt.Sprintf("%ci%d", s[0], r)
	var start time.Duration
	var err error
	if s == sysFloor {
		start, _, err = p.floorInitPod(ctx, name, initCount+appCount)
	} else {
		start, err = p.cycle(ctx, s, []string{name}, initPodSpec, initCount+appCount, nil)
	}
	if err == nil {
		p.add(measureInit, s, start.Seconds())
	}
	return err
}

// crashRun kills a one-container pod's process (SIGKILL from outside,
// as a crash) and takes, from the system's own records, the time from
// its exit to the new process's start: containerd's event timestamps
// (task exit, the next task start) for noderun, the floor and the
// kubelet; podman's container state (FinishedAt, StartedAt).
func (p *peers) crashRun(ctx context.Context, s string, r int) error {
	name := fmt.Sprintf("%cc%d", s[0], r)
	var d time.Duration
	var err error
	switch s {
	case sysFloor:
		d, err = p.floorCrash(ctx, name)
	case sysPodman:
		_, err = p.cycle(ctx, s, []string{name}, nil, 1, func() (err error) {
			d, err = p.podman.crash(ctx, name+"-main")
			return err
		})
	default:
		_, err = p.cycle(ctx, s, []string{name}, nil, 1, func() (err error) {
			d, err = p.crash(ctx, s, name)
			return err
		})
	}
	if err == nil {
		p.add(measureCrash, s, d.Seconds())
	}
	return err
}

// crash kills the pod's container on noderun or the kubelet and returns
// containerd's exit-to-start time, once the system's API shows the pod
// Ready again.
func (p *peers) crash(ctx context.Context, s, name string) (time.Duration, error) {
	client, ns, node := p.env.client, noderunNS, nodeName
	if s == sysKubelet {
		client, ns, node = p.kube.client, criNS, kubeNodeName
	}
	nctx := namespaces.WithNamespace(ctx, ns)
	cs, err := client.Containers(nctx)
	if err != nil {
		return 0, err
	}
	// The pod's running container: the kubelet keeps exited ones (of
	// removed pods, until its garbage collection) and its sandboxes.
	var running []containerd.Container
	for _, c := range cs {
		labels, err := c.Labels(nctx)
		if err != nil || labels["io.cri-containerd.kind"] == "sandbox" {
			continue
		}
		if task, err := c.Task(nctx, nil); err == nil {
			if st, err := task.Status(nctx); err == nil && st.Status == containerd.Running {
				running = append(running, c)
			}
		}
	}
	if len(running) != 1 {
		return 0, fmt.Errorf("crash: %d running containers in %s, want the pod's one", len(running), ns)
	}
	target := running[0]
	d, err := killAndTime(ctx, client, ns, target, nil)
	if err != nil {
		return 0, err
	}
	pods := func(ctx context.Context) ([]v1.Pod, error) { ps, _, err := p.node.pods(ctx); return ps, err }
	if s == sysKubelet {
		pods = p.kube.pods
	}
	for deadline := time.Now().Add(waitTimeout); ; {
		ps, err := pods(ctx)
		if err == nil && allOf(ps, []string{name}, node, restartedReady) {
			return d, nil
		}
		if time.Now().After(deadline) {
			return 0, errors.Join(err, fmt.Errorf("%s: pod not Ready again after its crash", s))
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return 0, err
		}
	}
}

// killAndTime SIGKILLs container c's process and returns the time from
// containerd's task exit event for it to the next task start event in
// its namespace. restart, if set, is what brings it back (the floor's).
func killAndTime(ctx context.Context, client *containerd.Client, ns string, c containerd.Container, restart func(context.Context) error) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(namespaces.WithNamespace(ctx, ns), waitTimeout)
	defer cancel()
	task, err := c.Task(ctx, nil)
	if err != nil {
		return 0, err
	}
	envs, errs := client.Subscribe(ctx, fmt.Sprintf(`topic=="/tasks/exit",namespace==%q`, ns), fmt.Sprintf(`topic==%q,namespace==%q`, topicStart, ns))
	if err := syscall.Kill(int(task.Pid()), syscall.SIGKILL); err != nil {
		return 0, err
	}
	restarted := make(chan error, 1)
	if restart != nil {
		go func() { restarted <- restart(ctx) }()
	}
	var exited time.Time
	for {
		select {
		case env := <-envs:
			ev, err := typeurl.UnmarshalAny(env.Event)
			if err != nil {
				continue
			}
			switch e := ev.(type) {
			case *apievents.TaskExit:
				if e.ContainerID == c.ID() && e.ID == e.ContainerID {
					exited = env.Timestamp
				}
			case *apievents.TaskStart:
				if !exited.IsZero() {
					if restart != nil {
						if err := <-restarted; err != nil {
							return 0, err
						}
					}
					return env.Timestamp.Sub(exited), nil
				}
			}
		case err := <-restarted:
			if err != nil {
				return 0, err
			}
			restart, restarted = nil, nil
		case err := <-errs:
			return 0, fmt.Errorf("events: %w", err)
		}
	}
}

// floorCrash starts one floor pod, kills its process and restarts it
// as directly as containerd allows: on the exit, the task deleted, a new
// one created and started.
func (p *peers) floorCrash(ctx context.Context, name string) (d time.Duration, err error) {
	pods, err := p.floorUp(ctx, []string{name})
	defer func() { err = errors.Join(err, p.floor.stopAll(context.WithoutCancel(ctx), pods)) }()
	if err != nil {
		return 0, err
	}
	fp := pods[0]
	return killAndTime(ctx, p.env.client, floorNS, fp.c, func(ctx context.Context) error {
		st, err := fp.task.Wait(ctx)
		if err != nil {
			return err
		}
		<-st
		return p.floor.restart(ctx, fp, false)
	})
}

// floorUp starts the floor pods and waits until containerd reported
// each process started, and for the settle time.
func (p *peers) floorUp(ctx context.Context, names []string) ([]*floorPod, error) {
	if err := sleep(ctx, settle); err != nil {
		return nil, err
	}
	p.fw.drain()
	pods, err := p.floor.startAll(ctx, names)
	pods = slices.DeleteFunc(pods, func(fp *floorPod) bool { return fp == nil })
	if err != nil {
		return pods, err
	}
	if _, err := p.fw.waitN(ctx, topicStart, len(names), waitTimeout); err != nil {
		return pods, err
	}
	return pods, sleep(ctx, settle)
}

// restart gives a floor pod a new process: the old task deleted and,
// after a reboot (network), the namespaces pinned and CNI ADD again
// (after a CNI DEL, which frees the address the lost namespace held).
func (f *floor) restart(ctx context.Context, fp *floorPod, network bool) error {
	ctx = namespaces.WithNamespace(ctx, floorNS)
	if _, err := fp.task.Delete(ctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
		return err
	}
	if network {
		// DEL without the netns (gone) frees the address.
		rt := f.rtConf(fp)
		rt.NetNS = ""
		if err := f.plugins.DelNetworkList(ctx, f.network, rt); err != nil {
			return fmt.Errorf("CNI DEL %s: %w", fp.id, err)
		}
		if _, err := cni.CreateNamespaces(fp.dir, fp.id, false, nil); err != nil {
			return err
		}
		if _, err := f.plugins.AddNetworkList(ctx, f.network, f.rtConf(fp)); err != nil {
			return fmt.Errorf("CNI ADD %s: %w", fp.id, err)
		}
	}
	task, err := f.newTask(ctx, fp.c, fp.id, "main")
	if err != nil {
		return err
	}
	fp.task = task
	return task.Start(ctx)
}

// rebootRun starts RebootPods pods on s, does to them what a power cut
// does (every task killed and deleted, the pods' network namespaces and
// the agent's run-time state gone; containerd's records and the state
// dirs stay) with the agent stopped, starts the agent again and times
// it until its API reports all pods Ready.
func (p *peers) rebootRun(ctx context.Context, s string, r int) error {
	names := podNames(fmt.Sprintf("%cb%d", s[0], r), p.pc.RebootPods)
	var d time.Duration
	var err error
	switch s {
	case sysFloor:
		d, err = p.floorReboot(ctx, names)
	case sysNoderun:
		_, err = p.cycle(ctx, s, names, nil, 1, func() (err error) { d, err = p.rebootNode(ctx, names); return err })
	case sysKubelet:
		_, err = p.cycle(ctx, s, names, nil, 1, func() (err error) { d, err = p.kube.reboot(ctx, names); return err })
	}
	if err == nil {
		p.add(fmt.Sprintf(measureReboot, len(names)), s, d.Seconds())
	}
	return err
}

// powerCut deletes every task of namespace ns, killing its process, and
// the masquerade rules of the pods in subnet, as a power cut ends them;
// containerd keeps the containers' records. A delete may fail because the
// shim went with another task (the CRI plugin's pods share one); what
// counts is that no task is left.
func powerCut(ctx context.Context, client *containerd.Client, ns, subnet string) error {
	if err := clearNAT(subnet); err != nil {
		return err
	}
	ctx = namespaces.WithNamespace(ctx, ns)
	var errs []error
	for range 3 {
		cs, err := client.Containers(ctx)
		if err != nil {
			return err
		}
		errs = nil
		for _, c := range cs {
			if task, err := c.Task(ctx, nil); err == nil {
				if _, err := task.Delete(ctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
					errs = append(errs, fmt.Errorf("delete task %s: %w", c.ID(), err))
				}
			}
		}
		ts, err := client.TaskService().List(ctx, &tasksapi.ListTasksRequest{})
		if err != nil {
			return err
		}
		if len(ts.Tasks) == 0 {
			return nil
		}
	}
	return errors.Join(append(errs, fmt.Errorf("tasks left in %s after the power cut", ns))...)
}

// rebootNode stops noderun, cuts the power to its pods, empties its run
// dir (a tmpfs, as /run) and starts it again.
func (p *peers) rebootNode(ctx context.Context, names []string) (time.Duration, error) {
	n := p.node
	n.stop()
	if err := powerCut(ctx, p.env.client, noderunNS, p.env.nodeSubnet); err != nil {
		return 0, err
	}
	sbs, _ := os.ReadDir(n.podsDir)
	for _, sb := range sbs {
		if err := cni.RemoveNamespaces(filepath.Join(n.podsDir, sb.Name()), nil); err != nil {
			return 0, err
		}
	}
	runDir := filepath.Join(n.dir, "run")
	ms, err := testnode.MountsUnder(runDir)
	if err != nil {
		return 0, err
	}
	slices.SortFunc(ms, func(a, b testnode.Mount) int { return len(b.Point) - len(a.Point) })
	for _, m := range ms {
		if err := unix.Unmount(m.Point, unix.MNT_DETACH); err != nil {
			return 0, fmt.Errorf("unmount %s: %w", m.Point, err)
		}
	}
	if err := os.RemoveAll(runDir); err != nil {
		return 0, err
	}
	t0 := time.Now()
	node, err := startNodeIn(ctx, p.env, n.dir, noderunNS, []string{p.env.imageTar})
	if node != nil {
		p.node = node
	}
	if err != nil {
		return 0, err
	}
	at, err := node.waitReadyAt(ctx, names)
	return at.Sub(t0), err
}

// reboot stops the kubelet, cuts the power to its pods (the sandboxes'
// network namespaces, pinned by the CRI plugin, go too) and starts the
// kubelet again; its containerd keeps running, as noderun's does.
func (k *kubelet) reboot(ctx context.Context, names []string) (time.Duration, error) {
	k.proc.Stop(20 * time.Second)
	// Started again even if the cut failed, so that the pods can go.
	cut := errors.Join(powerCut(ctx, k.client, criNS, k.subnet), k.removeNetNS(namespaces.WithNamespace(ctx, criNS)))
	t0 := time.Now()
	if err := k.start(ctx, false); err != nil || cut != nil {
		return 0, errors.Join(cut, err)
	}
	at, err := k.waitPods(ctx, names, true)
	return at.Sub(t0), err
}

// floorReboot is the least a recovery takes: for each pod at once, CNI
// DEL, the namespaces pinned, CNI ADD, a new task created and started,
// timed until containerd reported every process started.
func (p *peers) floorReboot(ctx context.Context, names []string) (d time.Duration, err error) {
	pods, err := p.floorUp(ctx, names)
	defer func() { err = errors.Join(err, p.floor.stopAll(context.WithoutCancel(ctx), pods)) }()
	if err != nil {
		return 0, err
	}
	if err := powerCut(ctx, p.env.client, floorNS, p.env.floorSubnet); err != nil {
		return 0, err
	}
	for _, fp := range pods {
		if err := cni.RemoveNamespaces(fp.dir, nil); err != nil {
			return 0, err
		}
	}
	p.fw.drain()
	t0 := time.Now()
	errs := make([]error, len(pods))
	var wg sync.WaitGroup
	for i, fp := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = p.floor.restart(ctx, fp, true)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	at, err := p.fw.waitN(ctx, topicStart, len(pods), waitTimeout)
	return at.Sub(t0), errors.Join(err, sleep(ctx, settle))
}

// crash kills a podman container's process and returns, from podman's
// records, the time from its exit to its restart by its restart policy
// (kube play's Always).
func (p *podman) crash(ctx context.Context, container string) (time.Duration, error) {
	state := func() (pid int, finished, started int64, err error) {
		out, err := p.run(ctx, "inspect", "--format", "{{.State.Pid}} {{.State.FinishedAt.UnixNano}} {{.State.StartedAt.UnixNano}}", container)
		if err != nil {
			return 0, 0, 0, err
		}
		f := strings.Fields(string(out))
		if len(f) != 3 {
			return 0, 0, 0, fmt.Errorf("podman inspect: %q", out)
		}
		pid, err = strconv.Atoi(f[0])
		finished, err2 := strconv.ParseInt(f[1], 10, 64)
		started, err3 := strconv.ParseInt(f[2], 10, 64)
		return pid, finished, started, errors.Join(err, err2, err3)
	}
	pid, _, started0, err := state()
	if err != nil {
		return 0, err
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return 0, err
	}
	for deadline := time.Now().Add(waitTimeout); ; {
		npid, finished, started, err := state()
		if err != nil {
			return 0, err
		}
		if npid != 0 && npid != pid && started > started0 {
			return time.Duration(started - finished), nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("podman: %s not restarted after %s", container, waitTimeout)
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return 0, err
		}
	}
}

// probeRun runs ProbePods pods each probed for readiness by httpGet every
// second on s and takes the CPU its agent and its whole stack use over
// CPUWindow. With noderun, it also takes the raw-syscall floor of the
// same probes to the same pods (the floor's figure).
func (p *peers) probeRun(ctx context.Context, s string) error {
	n := p.pc.ProbePods
	names := podNames(fmt.Sprintf("%cp", s[0]), n)
	spec := func(ps *v1.PodSpec) { httpProbed(&ps.Containers[0]) }
	_, err := p.cycle(ctx, s, names, spec, 1, func() error {
		if err := p.stackCPU(ctx, s, func(part string) string { return fmt.Sprintf(measureProbe, n, part) }); err != nil {
			return err
		}
		if s != sysNoderun {
			return nil
		}
		floor, err := p.probeFloor(ctx, names)
		p.add(fmt.Sprintf(measureProbe, n, "agent"), sysFloor, floor)
		return err
	})
	return err
}

// stackCPU takes the CPU of system s's agent (with its helper
// processes: noderun's log collector) and of its whole stack
// (stackProcs) over CPUWindow, in percent of a core, as the rows
// measure(part) names.
func (p *peers) stackCPU(ctx context.Context, s string, measure func(part string) string) error {
	parts, err := p.stackProcs(s)
	if err != nil {
		return err
	}
	type proc struct {
		agent bool
		cpu0  time.Duration
	}
	procs := map[int]*proc{}
	for part, pids := range parts {
		for _, pid := range pids {
			if t, err := testnode.CPUTime(pid); err == nil {
				procs[pid] = &proc{agent: part == partAgent || part == partLogging, cpu0: t}
			}
		}
	}
	t0 := time.Now()
	if err := sleep(ctx, p.pc.CPUWindow); err != nil {
		return err
	}
	var agent, stack time.Duration
	for pid, pr := range procs {
		if t, err := testnode.CPUTime(pid); err == nil {
			stack += t - pr.cpu0
			if pr.agent {
				agent += t - pr.cpu0
			}
		}
	}
	el := float64(time.Since(t0))
	if s != sysFloor && s != sysPodman { // no agent between commands
		p.add(measure("agent"), s, 100*float64(agent)/el)
	}
	p.add(measure("whole stack"), s, 100*float64(stack)/el)
	return nil
}

// clearNAT removes the bridge plugin's masquerade rules (a POSTROUTING
// jump per pod address, to a chain of the pod's) for the addresses in
// subnet, as a reboot empties the tables.
func clearNAT(subnet string) error {
	prefix, err := netip.ParsePrefix(subnet)
	if err != nil {
		return err
	}
	out, err := exec.Command("iptables", "-t", "nat", "-S", "POSTROUTING").Output()
	if err != nil {
		return fmt.Errorf("iptables -S: %w", err)
	}
	var errs []error
	for _, cmd := range natCleanup(string(out), prefix) {
		if out, err := exec.Command("sh", "-c", cmd).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w: %s", cmd, err, out))
		}
	}
	return errors.Join(errs...)
}

// natCleanup is the shell commands removing, from `iptables -t nat -S
// POSTROUTING`'s rules, the bridge plugin's jumps from an address in
// prefix and their chains. -S quotes the comments as a shell would.
func natCleanup(rules string, prefix netip.Prefix) []string {
	var cmds []string
	for _, line := range strings.Split(rules, "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || f[0] != "-A" || f[2] != "-s" || !strings.HasPrefix(f[len(f)-1], "CNI-") {
			continue
		}
		if src, err := netip.ParsePrefix(f[3]); err != nil || !prefix.Contains(src.Addr()) {
			continue
		}
		chain := f[len(f)-1]
		cmds = append(cmds, "iptables -t nat -D"+strings.TrimPrefix(line, "-A")+" && iptables -t nat -F "+chain+" && iptables -t nat -X "+chain)
	}
	return cmds
}
