package admission

import (
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// NodeLabels are the labels the kubelet gives its Node (hostname, os and
// arch, GA and beta) with extra, from --node-labels, over them.
func NodeLabels(nodeName string, extra map[string]string) map[string]string {
	out := map[string]string{
		v1.LabelHostname:   nodeName,
		v1.LabelOSStable:   runtime.GOOS,
		v1.LabelArchStable: runtime.GOARCH,
		betaLabelOS:        runtime.GOOS,
		betaLabelArch:      runtime.GOARCH,
	}
	maps.Copy(out, extra)
	return out
}

// The beta OS and arch labels the kubelet still sets (k8s.io/kubelet's
// pkg/apis; that module is not linked: requiring it would raise grpc and
// prometheus in the whole build).
const (
	betaLabelOS   = "beta.kubernetes.io/os"
	betaLabelArch = "beta.kubernetes.io/arch"
)

// kubeletLabels and kubeletLabelNamespaces are what a kubelet may set on
// its own Node in the kubernetes.io namespaces (k8s.io/kubelet's
// IsKubeletLabel), sorted as its message lists them.
var (
	kubeletLabels = []string{betaLabelArch, v1.LabelInstanceType, betaLabelOS, v1.LabelFailureDomainBetaRegion,
		v1.LabelFailureDomainBetaZone, v1.LabelArchStable, v1.LabelHostname, v1.LabelOSStable,
		v1.LabelInstanceTypeStable, v1.LabelTopologyRegion, v1.LabelTopologyZone}
	kubeletLabelNamespaces = []string{v1.LabelNamespaceSuffixKubelet, v1.LabelNamespaceSuffixNode}
)

// ParseNodeLabels reads --node-labels as the kubelet does: key=value pairs
// separated by commas (a value may be empty), each key a qualified name and
// each value a label value, and no key in the kubernetes.io or k8s.io
// namespaces but those a kubelet may set on its own Node.
func ParseNodeLabels(s string) (map[string]string, error) {
	out := map[string]string{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for _, pair := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if !ok {
			return nil, fmt.Errorf("%q: malformed pair, expect string=string", pair)
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return nil, fmt.Errorf("invalid node label key %q: %s", k, strings.Join(errs, ", "))
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			return nil, fmt.Errorf("invalid node label value %q of %s: %s", v, k, strings.Join(errs, ", "))
		}
		out[k] = v
	}
	var unknown []string
	for k := range out {
		if isKubernetesLabel(k) && !isKubeletLabel(k) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		return nil, fmt.Errorf("unknown 'kubernetes.io' or 'k8s.io' labels: %v; in those namespaces a label must begin with an allowed prefix (%s) or be one of %s, as for the kubelet",
			unknown, strings.Join(kubeletLabelNamespaces, ", "), strings.Join(kubeletLabels, ", "))
	}
	return out, nil
}

// isKubeletLabel reports whether a kubelet may set key on its own Node.
func isKubeletLabel(key string) bool {
	if slices.Contains(kubeletLabels, key) {
		return true
	}
	ns, _, _ := strings.Cut(key, "/")
	return slices.ContainsFunc(kubeletLabelNamespaces, func(allowed string) bool {
		return ns == allowed || strings.HasSuffix(ns, "."+allowed)
	})
}

// isKubernetesLabel reports whether key is in the kubernetes.io or k8s.io
// namespaces, where the kubelet allows only its own labels.
func isKubernetesLabel(key string) bool {
	ns, _, ok := strings.Cut(key, "/")
	if !ok {
		return false
	}
	for _, d := range []string{"kubernetes.io", "k8s.io"} {
		if ns == d || strings.HasSuffix(ns, "."+d) {
			return true
		}
	}
	return false
}
