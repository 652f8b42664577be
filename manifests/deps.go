package manifests

import (
	"fmt"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
)

// AnnotationPrefix is the prefix of every noderun extension annotation.
// Kubernetes ignores annotations it does not know, so a manifest using them
// still runs unchanged on a cluster.
const AnnotationPrefix = "noderun.dev/"

// WaitForAnnotation names the pods a pod waits for before it starts:
// "name[=Condition], ns/name[=Condition], ...", names as the local API
// shows them (a static pod's name ends in -<node>), condition Ready by
// default.
const WaitForAnnotation = AnnotationPrefix + "wait-for"

// WaitCondition is what a dependency must reach before its dependents start.
type WaitCondition string

// The conditions a pod may wait for.
const (
	WaitReady     WaitCondition = "Ready"     // the pod's Ready condition is True
	WaitStarted   WaitCondition = "Started"   // every container has started
	WaitCompleted WaitCondition = "Completed" // the pod Succeeded
)

// Dependency is one entry of a pod's wait-for annotation.
type Dependency struct {
	Namespace, Name string
	Condition       WaitCondition
}

// Key is the dependency's namespace/name.
func (d Dependency) Key() string { return d.Namespace + "/" + d.Name }

// String is the dependency as the pod's status names it: its name, with the
// namespace only when it is not the waiting pod's.
func (d Dependency) String(namespace string) string {
	if d.Namespace == namespace {
		return d.Name
	}
	return d.Key()
}

// ParseWaitFor parses a wait-for annotation of a pod in namespace.
func ParseWaitFor(value, namespace string) ([]Dependency, error) {
	var out []Dependency
	seen := map[string]bool{}
	for entry := range strings.SplitSeq(value, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			return nil, fmt.Errorf("empty entry in %q", value)
		}
		ref, cond, hasCond := strings.Cut(entry, "=")
		d := Dependency{Namespace: namespace, Name: strings.TrimSpace(ref), Condition: WaitReady}
		if hasCond {
			d.Condition = WaitCondition(strings.TrimSpace(cond))
			if !slices.Contains([]WaitCondition{WaitReady, WaitStarted, WaitCompleted}, d.Condition) {
				return nil, fmt.Errorf("%q: condition %q is none of Ready, Started, Completed", entry, cond)
			}
		}
		if ns, name, ok := strings.Cut(d.Name, "/"); ok {
			if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
				return nil, fmt.Errorf("%q: namespace %q: %s", entry, ns, strings.Join(msgs, "; "))
			}
			d.Namespace, d.Name = ns, name
		}
		if msgs := validation.IsDNS1123Subdomain(d.Name); len(msgs) > 0 {
			return nil, fmt.Errorf("%q: pod name %q: %s", entry, d.Name, strings.Join(msgs, "; "))
		}
		if seen[d.Key()] {
			return nil, fmt.Errorf("%s is named twice", d.Key())
		}
		seen[d.Key()] = true
		out = append(out, d)
	}
	return out, nil
}

// WaitFor returns the dependencies of a validated pod (none if it has no
// wait-for annotation or, never for a validated pod, an invalid one).
func WaitFor(pod *v1.Pod) []Dependency {
	value, ok := pod.Annotations[WaitForAnnotation]
	if !ok {
		return nil
	}
	deps, _ := ParseWaitFor(value, pod.Namespace)
	return deps
}

// waitForField is the field path of the annotation in errors.
const waitForField = "metadata.annotations[" + WaitForAnnotation + "]"

// waitFor validates the annotation's syntax; what it names is checked
// across the set of pods (DependencyErrors).
func (v *validator) waitFor(pod *v1.Pod) {
	value, ok := pod.Annotations[WaitForAnnotation]
	if !ok {
		return
	}
	ns := pod.Namespace
	if ns == "" {
		ns = v1.NamespaceDefault
	}
	if _, err := ParseWaitFor(value, ns); err != nil {
		v.add(waitForField, "%v", err)
	}
}

// DependencyErrors checks the wait-for annotations of a set of pods: a pod
// that names itself, is on a cycle, or waits for a pod that never completes
// (restartPolicy Always) for Completed would wait forever, and is refused.
// With complete, pods is every pod of the node, and a name none of them has
// is an error too; otherwise it may be defined elsewhere (another source).
func DependencyErrors(pods []*v1.Pod, complete bool) map[types.UID]*ManifestError {
	byKey := map[string]*v1.Pod{}
	for _, p := range pods {
		byKey[p.Namespace+"/"+p.Name] = p
	}
	out := map[types.UID]*ManifestError{}
	fail := func(p *v1.Pod, format string, args ...any) {
		if out[p.UID] == nil {
			out[p.UID] = &ManifestError{Field: waitForField, Message: fmt.Sprintf(format, args...)}
		}
	}
	for _, p := range pods {
		for _, d := range WaitFor(p) {
			dep := byKey[d.Key()]
			switch {
			case dep == p:
				fail(p, "the pod waits for itself")
			case dep == nil && complete:
				fail(p, "waits for %s, which no manifest defines", d.Key())
			case dep != nil && d.Condition == WaitCompleted && dep.Spec.RestartPolicy == v1.RestartPolicyAlways:
				fail(p, "waits for %s to complete, but its restartPolicy is Always: it never completes", d.Key())
			}
		}
	}
	for _, group := range dependencyCycles(pods, byKey) {
		names := make([]string, 0, len(group))
		for _, q := range group {
			names = append(names, q.Namespace+"/"+q.Name)
		}
		slices.Sort(names) // the same message whatever the order pods come in
		for _, p := range group {
			fail(p, "wait-for cycle among %s: none of them could ever start", strings.Join(names, ", "))
		}
	}
	return out
}

// dependencyCycles returns the groups of pods that wait for each other:
// the strongly connected components of the wait-for graph (Tarjan's
// algorithm) of more than one pod; a self-reference is left to the caller.
func dependencyCycles(pods []*v1.Pod, byKey map[string]*v1.Pod) [][]*v1.Pod {
	index, low := map[*v1.Pod]int{}, map[*v1.Pod]int{}
	onStack := map[*v1.Pod]bool{}
	var stack []*v1.Pod
	var groups [][]*v1.Pod
	var visit func(p *v1.Pod)
	visit = func(p *v1.Pod) {
		index[p], low[p] = len(index), len(index)
		stack, onStack[p] = append(stack, p), true
		for _, d := range WaitFor(p) {
			dep := byKey[d.Key()]
			if dep == nil {
				continue
			}
			if _, seen := index[dep]; !seen {
				visit(dep)
				low[p] = min(low[p], low[dep])
			} else if onStack[dep] {
				low[p] = min(low[p], index[dep])
			}
		}
		if low[p] != index[p] {
			return
		}
		i := slices.Index(stack, p)
		group := slices.Clone(stack[i:])
		for _, q := range group {
			onStack[q] = false
		}
		stack = stack[:i]
		if len(group) > 1 {
			groups = append(groups, group)
		}
	}
	for _, p := range pods {
		if _, seen := index[p]; !seen {
			visit(p)
		}
	}
	return groups
}
