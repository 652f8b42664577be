package manifests

import (
	"fmt"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// fileResult is what one file (or one URL's body) yielded.
type fileResult struct {
	data   []byte // content as last read, to skip re-parsing it unchanged
	readOK bool
	readAt time.Time // when the content in use was read
	pods   []entry
	errs   []error
	warns  []error // ignored-on-purpose fields, one *ManifestError each
}

// entry is an accepted pod and where it came from.
type entry struct {
	pod   *v1.Pod
	line  int
	sum   string // hash of the pod's JSON, so edits show even with a fixed UID
	stale bool   // kept from an earlier version: the current one has errors
}

// parseManifest turns content into accepted pods and errors; file names the
// content in errors and source is the identity's source (see Identify).
func parseManifest(data []byte, file, nodeName, source string, now time.Time) *fileResult {
	res := &fileResult{data: data, readOK: true, readAt: now}
	docs, errs := decodeDocuments(data)
	locate(errs, file, 0)
	res.errs = errs
	for _, d := range docs {
		verrs, warns := checkPod(d.pod)
		locateFields(warns, d.chunk)
		locateFields(verrs, d.chunk)
		locate(warns, file, d.line)
		res.warns = append(res.warns, warns...)
		if len(verrs) > 0 {
			locate(verrs, file, d.line)
			res.errs = append(res.errs, verrs...)
			continue
		}
		Identify(d.pod, nodeName, source, d.raw)
		if ierrs := checkIdentity(d.pod); len(ierrs) > 0 {
			locate(ierrs, file, d.line)
			res.errs = append(res.errs, ierrs...)
			continue
		}
		res.pods = append(res.pods, entry{pod: d.pod, line: d.line, sum: contentHash(d.raw, "", "")})
	}
	return res
}

// checkPod applies the field lists to what the manifest says, before
// defaults fill fields in, then defaults and validates the pod.
func checkPod(pod *v1.Pod) (errs, warnings []error) {
	errs, warnings = fieldErrors(checkFields(pod))
	warnings = append(warnings, appArmorWarnings(pod)...)
	ApplyDefaults(pod)
	return append(errs, Validate(pod)...), warnings
}

// keepLastGood gives next, the result of new content with errors, the pods of
// prev that next does not yield validly, marked stale: the kubelet would kill
// them, but a typo must not take an appliance's pods down. A pod that next
// yields validly takes its new spec; without errors, next stands as it is, so
// removing a document removes its pod once the file is valid again.
func keepLastGood(prev, next *fileResult) *fileResult {
	if prev == nil || len(next.errs) == 0 {
		return next
	}
	have := map[string]bool{}
	for _, e := range next.pods {
		have[podKey(e.pod)] = true
	}
	for _, e := range prev.pods {
		if !have[podKey(e.pod)] {
			e.stale = true
			next.pods = append(next.pods, e)
		}
	}
	return next
}

// readFailed is the result of a file that could not be read: its error, and
// the pods it had, as for invalid content.
func readFailed(prev *fileResult, err error) *fileResult {
	return keepLastGood(prev, &fileResult{errs: []error{err}})
}

// assemble joins results in the given order into a snapshot, where the first
// definition of a namespace/name (or UID) wins and later ones are errors, and
// fingerprints what the runner would see so unchanged re-reads send nothing.
func assemble(source string, order []string, results map[string]*fileResult, extra ...error) (Snapshot, string) {
	snap := Snapshot{Source: source, Info: SourceInfo{Source: source, Pods: []PodInfo{}}}
	var fp strings.Builder
	names := map[string]string{}   // namespace/name -> where defined
	uids := map[types.UID]string{} // UID -> where defined
	type fileEntry struct {
		file string
		entry
	}
	// Pods that wait for each other are refused once every pod is known.
	var accepted []fileEntry
	for _, file := range order {
		f := results[file]
		snap.Errors = append(snap.Errors, f.errs...)
		snap.Warnings = append(snap.Warnings, f.warns...)
		for _, e := range f.pods {
			where := fmt.Sprintf("%s:%d", file, e.line)
			key := podKey(e.pod)
			if first, dup := names[key]; dup {
				snap.Errors = append(snap.Errors, &ManifestError{File: file, Line: e.line, Field: "metadata.name",
					Message: fmt.Sprintf("pod %s is already defined in %s", key, first)})
				continue
			}
			if first, dup := uids[e.pod.UID]; dup {
				snap.Errors = append(snap.Errors, &ManifestError{File: file, Line: e.line, Field: "metadata.uid",
					Message: fmt.Sprintf("uid %s is already used by the pod in %s", e.pod.UID, first)})
				continue
			}
			names[key], uids[e.pod.UID] = where, where
			accepted = append(accepted, fileEntry{file, e})
		}
	}
	pods := make([]*v1.Pod, len(accepted))
	for i, a := range accepted {
		pods[i] = a.pod
	}
	depErrs := DependencyErrors(pods, false)
	for _, a := range accepted {
		if me := depErrs[a.pod.UID]; me != nil {
			me.File, me.Line = a.file, a.line
			snap.Errors = append(snap.Errors, me)
			continue
		}
		snap.Pods = append(snap.Pods, a.pod)
		snap.Info.Pods = append(snap.Info.Pods, podInfo(a.file, a.entry))
		fmt.Fprintf(&fp, "pod %s %s %t\n", a.pod.UID, a.sum, a.stale)
	}
	snap.Errors = append(snap.Errors, extra...)
	for _, w := range snap.Warnings {
		snap.Info.Warnings = append(snap.Info.Warnings, w.Error())
		fmt.Fprintf(&fp, "warning %s\n", w)
	}
	for _, err := range snap.Errors {
		snap.Info.Errors = append(snap.Info.Errors, err.Error())
		fmt.Fprintf(&fp, "error %s\n", err)
	}
	return snap, fp.String()
}
