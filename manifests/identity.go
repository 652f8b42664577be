package manifests

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
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

// maxUIDLength bounds metadata.uid: a UUID is 36 characters, noderun's own
// hashes 32; the rest of NAME_MAX goes to the pod's namespace and name.
const maxUIDLength = 64

// uidChars is what a UID may hold: it names directories noderun creates and
// removes, so it must be one harmless path component.
var uidChars = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$`)

// CheckUID says why uid cannot name a pod's directories, or nil. It admits
// UUIDs, noderun's content hashes and other DNS-label-like tokens.
func CheckUID(uid string) error {
	switch {
	case uid == "":
		return fmt.Errorf("must not be empty")
	case len(uid) > maxUIDLength:
		return fmt.Errorf("must be at most %d characters", maxUIDLength)
	case !uidChars.MatchString(uid) || strings.Contains(uid, ".."):
		return fmt.Errorf("%q must consist of letters, digits, '-', '_' and '.', start and end with a letter or digit, and not contain '..'", uid)
	}
	return nil
}

// checkIdentity checks what Identify made of a pod against the limits of
// the names derived from it: the final name is a DNS subdomain of at most
// 253 characters, and the log directory "<namespace>_<name>_<uid>" fits
// NAME_MAX (255).
func checkIdentity(pod *v1.Pod) []error {
	var errs []error
	if msgs := validation.IsDNS1123Subdomain(pod.Name); len(msgs) > 0 {
		errs = append(errs, &ManifestError{Field: "metadata.name", Message: fmt.Sprintf(
			"the pod's final name %q (name-nodeName): %s", pod.Name, strings.Join(msgs, "; "))})
	}
	if n := len(pod.Namespace) + len(pod.Name) + len(pod.UID) + 2; n > 255 {
		errs = append(errs, &ManifestError{Field: "metadata.name", Message: fmt.Sprintf(
			"namespace, final name and uid make a %d-character log directory name; at most 255 fit", n)})
	}
	return errs
}

// contentHash is the first 128 bits of a SHA-256 over the three parts,
// separated by NULs, which none of them can contain.
func contentHash(raw []byte, nodeName, source string) string {
	h := sha256.New()
	h.Write(raw)
	fmt.Fprintf(h, "\x00%s\x00%s", nodeName, source)
	return hex.EncodeToString(h.Sum(nil))[:32]
}
