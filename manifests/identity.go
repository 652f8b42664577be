package manifests

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Annotations the kubelet sets on static pods; tools that read mirror pods
// look for these keys.
const (
	ConfigSourceAnnotation = "kubernetes.io/config.source"
	ConfigHashAnnotation   = "kubernetes.io/config.hash"
	ConfigSeenAnnotation   = "kubernetes.io/config.seen"
)

// Identify gives a decoded pod its static-pod identity, as the kubelet does:
// name "<name>-<nodeName>", namespace "default" when empty, spec.nodeName,
// and a UID that is metadata.uid when set or else a hash of raw (the
// document's canonical JSON), nodeName and source, so the same manifest on the
// same node keeps its UID across restarts and an edit yields a new one.
// source is "<kind>:<location>", e.g. "file:/etc/pods"; its kind becomes the
// config.source annotation. Call it once per decoded pod.
func Identify(pod *v1.Pod, nodeName, source string, raw []byte) {
	if pod.UID == "" {
		pod.UID = types.UID(contentHash(raw, nodeName, source))
	}
	pod.Name = pod.Name + "-" + nodeName
	if pod.Namespace == "" {
		pod.Namespace = v1.NamespaceDefault
	}
	pod.Spec.NodeName = nodeName
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	kind, _, _ := strings.Cut(source, ":")
	pod.Annotations[ConfigSourceAnnotation] = kind
	pod.Annotations[ConfigHashAnnotation] = string(pod.UID)
	pod.Annotations[ConfigSeenAnnotation] = time.Now().UTC().Format(time.RFC3339)
}

// contentHash is the first 128 bits of a SHA-256 over the three parts,
// separated by NULs, which none of them can contain.
func contentHash(raw []byte, nodeName, source string) string {
	h := sha256.New()
	h.Write(raw)
	fmt.Fprintf(h, "\x00%s\x00%s", nodeName, source)
	return hex.EncodeToString(h.Sum(nil))[:32]
}
