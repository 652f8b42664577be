package admission

import (
	"slices"
	"strconv"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// matchesAffinity reports whether the node's labels and name match the
// pod's nodeSelector (every key equal) and required node affinity (any one
// term), as the scheduler's nodeaffinity matcher that the kubelet calls
// (k8s.io/component-helpers/scheduling/corev1/nodeaffinity). Written out
// rather than linked: the library's label and field selector parsing cost
// about 100 KB of a binary with no room to spare.
func matchesAffinity(pod *v1.Pod, node *v1.Node) bool {
	for k, v := range pod.Spec.NodeSelector {
		if got, ok := node.Labels[k]; !ok || got != v {
			return false
		}
	}
	a := pod.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return true
	}
	for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		// An empty term matches nothing; an invalid one is skipped.
		if len(term.MatchExpressions) == 0 && len(term.MatchFields) == 0 {
			continue
		}
		if termMatches(term, node) {
			return true
		}
	}
	return false
}

// termMatches ANDs a term's label expressions and its field expressions
// (metadata.name, In or NotIn with one value); a requirement the API would
// not accept makes the term match nothing, as a parse error does there.
func termMatches(term v1.NodeSelectorTerm, node *v1.Node) bool {
	for _, r := range term.MatchExpressions {
		if !requirementMatches(r, node.Labels) {
			return false
		}
	}
	for _, r := range term.MatchFields {
		if len(r.Values) != 1 {
			return false
		}
		value := ""
		if r.Key == "metadata.name" {
			value = node.Name
		}
		switch {
		case r.Operator == v1.NodeSelectorOpIn && value != r.Values[0],
			r.Operator == v1.NodeSelectorOpNotIn && value == r.Values[0],
			r.Operator != v1.NodeSelectorOpIn && r.Operator != v1.NodeSelectorOpNotIn:
			return false
		}
	}
	return true
}

// requirementMatches is one label requirement, with labels.Requirement's
// rules: a qualified key; In and NotIn with values, Exists and
// DoesNotExist with none, Gt and Lt with one integer compared to the
// label's integer value.
func requirementMatches(r v1.NodeSelectorRequirement, labels map[string]string) bool {
	if len(validation.IsQualifiedName(r.Key)) > 0 {
		return false
	}
	got, has := labels[r.Key]
	switch r.Operator {
	case v1.NodeSelectorOpIn, v1.NodeSelectorOpNotIn:
		if len(r.Values) == 0 || slices.ContainsFunc(r.Values, func(v string) bool { return len(validation.IsValidLabelValue(v)) > 0 }) {
			return false
		}
		in := has && slices.Contains(r.Values, got)
		return in == (r.Operator == v1.NodeSelectorOpIn)
	case v1.NodeSelectorOpExists, v1.NodeSelectorOpDoesNotExist:
		return len(r.Values) == 0 && has == (r.Operator == v1.NodeSelectorOpExists)
	case v1.NodeSelectorOpGt, v1.NodeSelectorOpLt:
		if len(r.Values) != 1 {
			return false
		}
		want, err := strconv.ParseInt(r.Values[0], 10, 64)
		if err != nil || !has {
			return false
		}
		n, err := strconv.ParseInt(got, 10, 64)
		if err != nil {
			return false
		}
		return r.Operator == v1.NodeSelectorOpGt && n > want || r.Operator == v1.NodeSelectorOpLt && n < want
	}
	return false
}
