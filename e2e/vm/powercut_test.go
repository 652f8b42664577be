package vm

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// The power cut scenario's steady pods: one writing its log all the time
// (Always), one that ran to completion (Never) and must stay completed.
const (
	loggerPod = `apiVersion: v1
kind: Pod
metadata:
  name: logger
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: app
    image: ` + busyboxImage + `
    command: ["sh", "-c", "i=0; while true; do i=$((i+1)); echo line $i of a log written until the power goes; usleep 20000; done"]
`
	donePod = `apiVersion: v1
kind: Pod
metadata:
  name: done
spec:
  restartPolicy: Never
  containers:
  - name: app
    image: ` + busyboxImage + `
    command: ["sh", "-c", "echo ran once"]
`
)

// census counts what pods leave in the machine, by kind. After a boot
// the kernel's objects are new, so each count is a function of the pods
// noderun runs: a leak is a count above it, whatever noderun kept on disk
// and restored.
const census = `ns=noderun
echo containers $(ctr -n $ns containers ls -q | wc -l)
echo tasks $(ctr -n $ns tasks ls -q | wc -l)
echo active-snapshots $(ctr -n $ns snapshots ls | grep -cw Active)
echo leases-not-stock $(ctr -n $ns leases ls | tail -n +2 | grep -vc 'io.noderun.lease=create')
echo sandboxes $(ls /run/noderun/pods 2>/dev/null | wc -l)
echo netns $(ip netns list | wc -l)
echo veths $(ip -o link show type veth | wc -l)
echo ip-leases $(find /var/lib/noderun/cni/networks /var/lib/cni/networks -mindepth 2 -maxdepth 2 -type f ! -name lock ! -name 'last_reserved_ip*' 2>/dev/null | wc -l)
echo pod-cgroups $(find /sys/fs/cgroup -type d \( -name 'noderun*-pod*.slice' -o -path '*/noderun/*pod*' -name 'pod*' \) | wc -l)
echo mounts $(grep -cE ' /run/(containerd|noderun)/' /proc/self/mountinfo)
# A shim is stray when no task's process is its child (the runc container
# is reparented to its shim, a subreaper). Not one per group: a group can
# be served by two shims, as containerd's shim starter takes the group's
# shim for dead when its socket does not answer within 100 ms (a TCG
# machine at boot) and starts another beside it; both serve tasks.
parents=$(for p in $(ctr -n $ns tasks ls | awk 'NR > 1 && $2 > 0 { print $2 }'); do awk '/^PPid:/ { print $2 }' /proc/$p/status; done)
echo stray-shims $(for s in $(pgrep containerd-shim); do echo "$parents" | grep -qx $s || echo $s; done | wc -l)
`

// shimReport lists each shim: its task, the group sockets it listens on
// and its children (the tasks' processes), for the log when shims are
// stray or split.
const shimReport = `for s in $(pgrep containerd-shim); do
  socks=$(for i in $(ls -l /proc/$s/fd 2>/dev/null | grep -o 'socket:\[[0-9]*\]' | tr -dc '0-9\n'); do awk -v i=$i '$7 == i && $8 ~ "^/run/containerd/s/" { print $8 }' /proc/net/unix; done | sort -u | tr '\n' ' ')
  echo "shim $s $(tr '\0' ' ' < /proc/$s/cmdline | grep -o -- '-id [^ ]*') listens on: $socks children: $(pgrep -P $s | tr '\n' ' ')"
done`

// logSplitGroups logs the shims when two of them listen on one group's
// socket: a group split by containerd's shim starter (see census).
func (n *node) logSplitGroups(cut int) {
	n.t.Helper()
	report := n.sh(shimReport)
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(report), "\n") {
		_, socks, _ := strings.Cut(line, "listens on: ")
		socks, _, _ = strings.Cut(socks, " children:")
		if socks = strings.TrimSpace(socks); socks != "" && seen[socks] {
			n.t.Logf("power cut %d: a shim group served by two shims:\n%s", cut, report)
			return
		}
		seen[socks] = true
	}
}

// leakCounts parses census's output.
func leakCounts(t *testing.T, out string) map[string]int {
	t.Helper()
	m := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			t.Fatalf("census line %q", line)
		}
		v, err := strconv.Atoi(f[1])
		if err != nil {
			t.Fatalf("census line %q: %v", line, err)
		}
		m[f[0]] = v
	}
	return m
}

// TestVMPowerCuts cuts the machine's power (qemu killed) at a random point
// while a pod is created, a pod deleted, an image imported, or just while
// a log is written, NODERUN_VM_POWERCUTS times in a row (make test-vm:
// 20). After each boot noderun must start once, without repair; every
// pod come back as its restartPolicy says (the completed one stays
// completed, a deleted one stays gone), its log be readable, and nothing
// be left of pods beyond what the pods running now hold. The time from
// the kernel's boot to the last container running is taken from
// noderun's records (the containers' startedAt) and the kernel's btime.
func TestVMPowerCuts(t *testing.T) {
	cuts := 20
	if s := os.Getenv("NODERUN_VM_POWERCUTS"); s != "" {
		var err error
		if cuts, err = strconv.Atoi(s); err != nil {
			t.Fatalf("NODERUN_VM_POWERCUTS=%q: %v", s, err)
		}
	}
	n := bootNode(t, "systemd")
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d (NODERUN_VM_SEED repeats it)", seed)
	if s := os.Getenv("NODERUN_VM_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	rng := rand.New(rand.NewPCG(seed, seed))
	n.sh("cp /var/lib/noderun/images/busybox.tar /root/busybox.tar")
	n.apply("logger", loggerPod)
	n.apply("done", donePod)
	churn := []string{} // the churn pods whose manifests are in place

	// The baseline: the counts after a clean reboot with no churn pod,
	// then what one more running pod adds.
	n.waitPods("logger running, done completed", n.expect(churn))
	n.reboot(func(ctx context.Context) error { return n.vm.Poweroff(ctx) })
	n.waitPods("after a clean reboot", n.expect(churn))
	base := n.settledCounts(nil)
	n.apply("churn-0", sleepPod("churn-0", "2000000", ""))
	churn = append(churn, "churn-0")
	n.waitPods("churn-0 running", n.expect(churn))
	per := n.settledCounts(nil)
	for k := range per {
		per[k] -= base[k]
	}
	t.Logf("counts with no churn pod %v; each running pod adds %v", base, per)

	var bootToRunning []time.Duration
	for i := 1; i <= cuts; i++ {
		action := []string{"create", "delete", "import", "logs"}[rng.IntN(4)]
		if action == "delete" && len(churn) == 0 {
			action = "create"
		}
		switch action {
		case "create":
			name := fmt.Sprintf("churn-%d", i)
			n.apply(name, sleepPod(name, strconv.Itoa(2000000+i), ""))
			churn = append(churn, name)
		case "delete":
			j := rng.IntN(len(churn))
			n.sh(fmt.Sprintf("rm %s/%s.yaml && sync -f %s", podsDir, churn[j], podsDir))
			churn = slices.Delete(churn, j, j+1)
		case "import":
			n.sh(fmt.Sprintf("cp /root/busybox.tar /var/lib/noderun/images/.import-%d && sync /var/lib/noderun/images/.import-%d && mv /var/lib/noderun/images/.import-%d /var/lib/noderun/images/import-%d.tar", i, i, i, i))
		}
		// Within the 4 s after the change, when noderun works on it.
		delay := time.Duration(rng.Int64N(int64(4 * time.Second)))
		time.Sleep(delay) // the cut's random point, not a synchronisation
		t.Logf("power cut %d/%d: %s, %s after the change", i, cuts, action, delay.Round(time.Millisecond))
		n.reboot(func(context.Context) error { return n.vm.PowerCut() })
		pods := n.waitPods(fmt.Sprintf("power cut %d: the pods as their manifests and restartPolicy say", i), n.expect(churn))
		d := n.bootToRunning(pods)
		bootToRunning = append(bootToRunning, d)
		if got := strings.TrimSpace(n.sh("systemctl show -P NRestarts noderun")); got != "0" {
			n.t.Errorf("power cut %d: noderun restarted %s times after the boot, want 0:\n%s", i, got, n.sh("journalctl -b -u noderun -p warning --no-pager | tail -40"))
		}
		n.sh("noderun logs --tail 3 logger-" + nodeName) // flags before the pod
		want := map[string]int{}
		for k, v := range base {
			want[k] = v + per[k]*len(churn)
		}
		n.settledCounts(want)
		n.logSplitGroups(i)
		t.Logf("power cut %d: all pods as expected; boot to all Running %s", i, d.Round(100*time.Millisecond))
	}
	slices.Sort(bootToRunning)
	if len(bootToRunning) > 0 {
		fmt.Printf("make test-vm: %d power cuts survived (%s); boot to all pods Running: median %s, min %s, max %s\n",
			cuts, n.vm.Accel, bootToRunning[len(bootToRunning)/2].Round(100*time.Millisecond),
			bootToRunning[0].Round(100*time.Millisecond), bootToRunning[len(bootToRunning)-1].Round(100*time.Millisecond))
	}
}

// reboot stops the machine with stop and boots it again.
func (n *node) reboot(stop func(context.Context) error) {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	if err := stop(ctx); err != nil {
		n.t.Fatal(err)
	}
	if err := n.vm.Boot(ctx); err != nil {
		n.t.Fatal(err)
	}
}

// expect is the power cut scenario's condition: exactly the pods of the
// manifests in place, logger and the churn pods Running, done Succeeded
// with its one run.
func (n *node) expect(churn []string) func(map[string]v1.Pod) bool {
	return func(pods map[string]v1.Pod) bool {
		if len(pods) != len(churn)+2 || !running(append([]string{"logger"}, churn...)...)(pods) {
			return false
		}
		done := pods["done"]
		return done.Status.Phase == v1.PodSucceeded && len(done.Status.ContainerStatuses) == 1 &&
			done.Status.ContainerStatuses[0].RestartCount == 0
	}
}

// bootToRunning is the time from the kernel's boot to the last of the
// pods' running containers starting, as noderun recorded it.
func (n *node) bootToRunning(pods map[string]v1.Pod) time.Duration {
	n.t.Helper()
	btime, err := strconv.ParseInt(strings.TrimSpace(n.sh("awk '$1 == \"btime\" {print $2}' /proc/stat")), 10, 64)
	if err != nil {
		n.t.Fatalf("btime: %v", err)
	}
	var last time.Time
	for _, p := range pods {
		for _, cs := range p.Status.ContainerStatuses {
			if cs.State.Running != nil && cs.State.Running.StartedAt.After(last) {
				last = cs.State.Running.StartedAt.Time
			}
		}
	}
	return last.Sub(time.Unix(btime, 0))
}

// settledCounts takes the census until it equals want (nil: until two in
// a row agree) and returns it: a teardown may still be under way when the
// pods already look right. A census that never settles on want is a leak.
func (n *node) settledCounts(want map[string]int) map[string]int {
	n.t.Helper()
	deadline := time.Now().Add(podTimeout)
	var prev map[string]int
	for {
		got := leakCounts(n.t, n.sh(census))
		if want == nil && prev != nil && fmt.Sprint(got) == fmt.Sprint(prev) {
			return got
		}
		if want != nil && fmt.Sprint(got) == fmt.Sprint(want) {
			return got
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("the machine holds %v, want %v (pods of a manifest leaked or lost); the shims:\n%s", got, want, n.sh(shimReport))
		}
		prev = got
		time.Sleep(2 * time.Second) // a poll of the machine's state
	}
}
