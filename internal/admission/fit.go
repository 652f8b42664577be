package admission

import (
	"fmt"
	"maps"
	"slices"

	v1 "k8s.io/api/core/v1"
)

// insufficient is the kubelet's InsufficientResourceError.
type insufficient struct {
	name                      v1.ResourceName
	requested, used, capacity int64
}

func (i insufficient) result() Result {
	return Result{
		Reason: insufficientPrefix + string(i.name),
		Message: fmt.Sprintf("Node didn't have enough resource: %s, requested: %d, used: %d, capacity: %d",
			i.name, i.requested, i.used, i.capacity),
	}
}

// fits checks the pod's requests against the node's allocatable less what
// the others request, in the scheduler's order: the pod count, cpu (in
// millicores), memory, ephemeral-storage, then other resources (by name,
// for one answer every time). A resource the pod does not request is not
// checked, and a request larger than the whole node is reported the same
// way (the kubelet has no other message for it).
func fits(pod *v1.Pod, others []*v1.Pod, node *v1.Node) Result {
	alloc := node.Status.Allocatable
	if maxPods := alloc.Pods().Value(); int64(len(others))+1 > maxPods {
		return insufficient{v1.ResourcePods, 1, int64(len(others)), maxPods}.result()
	}
	want := requests(pod)
	used := v1.ResourceList{}
	for _, o := range others {
		for name, q := range requests(o) {
			sum := used[name]
			sum.Add(q)
			used[name] = sum
		}
	}
	amount := func(l v1.ResourceList, name v1.ResourceName) int64 {
		q := l[name]
		if name == v1.ResourceCPU {
			return q.MilliValue()
		}
		return q.Value()
	}
	order := []v1.ResourceName{v1.ResourceCPU, v1.ResourceMemory, v1.ResourceEphemeralStorage}
	for _, name := range slices.Sorted(maps.Keys(want)) {
		if !slices.Contains(order, name) && name != v1.ResourcePods {
			order = append(order, name)
		}
	}
	for _, name := range order {
		w := amount(want, name)
		if w <= 0 {
			continue
		}
		if u, c := amount(used, name), amount(alloc, name); w > c-u {
			return insufficient{name, w, u, c}.result()
		}
	}
	return Result{}
}
