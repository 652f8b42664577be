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
	file   string // as errors name it
	data   []byte // content as last read, to skip re-parsing it unchanged
	readOK bool
	readAt time.Time // when the content in use was read
	pods   []entry
	// objects are its ConfigMaps and Secrets (with --local-config-objects).
	objects []objectEntry
	errs    []error
	warns   []error // ignored-on-purpose fields, one *ManifestError each
}

// entry is an accepted pod and where it came from.
type entry struct {
	pod   *v1.Pod
	line  int
	sum   string // hash of the pod's JSON, so edits show even with a fixed UID
	stale bool   // kept from an earlier version: the current one has errors
}

// parseManifest turns content into accepted pods, config objects and
// errors; file names the content in errors and source is the identity's
// source (see Identify).
func parseManifest(data []byte, file, nodeName, source string, now time.Time, opts parseOptions) *fileResult {
	res := &fileResult{file: file, data: data, readOK: true, readAt: now}
	docs, errs := decodeDocuments(data)
	locate(errs, file, 0)
	res.errs = errs
	for _, d := range docs {
		if d.obj != nil {
			res.addObject(d, file, opts)
			continue
		}
		verrs, warns := checkPod(d.pod, opts)
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

// addObject accepts a ConfigMap or Secret document, or adds its errors:
// without --local-config-objects there is nothing it may be.
func (res *fileResult) addObject(d document, file string, opts parseOptions) {
	if !opts.localConfig {
		res.errs = append(res.errs, &ManifestError{File: file, Line: d.line, Field: "kind",
			Message: fmt.Sprintf("unsupported kind %q (want Pod or PodList; ConfigMap and Secret documents need --local-config-objects)", d.obj.kind())})
		return
	}
	errs := acceptObject(d.obj)
	locateFields(errs, d.chunk)
	locate(errs, file, d.line)
	if len(errs) > 0 {
		res.errs = append(res.errs, errs...)
		return
	}
	d.obj.line = d.line
	res.objects = append(res.objects, *d.obj)
}

// CheckPod applies the field table, the defaults and the validation of a
// manifest's pod to a pod made through the API (kubectl debug node). Errors
// are *ManifestError; warnings are the fields noderun ignores. It refers
// to no ConfigMap or Secret: such a reference is refused by name.
func CheckPod(pod *v1.Pod) (errs, warnings []error) { return checkPod(pod, parseOptions{}) }

// checkPod applies the field lists to what the manifest says, before
// defaults fill fields in, then defaults and validates the pod.
func checkPod(pod *v1.Pod, opts parseOptions) (errs, warnings []error) {
	errs, warnings = fieldErrors(checkFields(pod, opts))
	warnings = append(warnings, appArmorWarnings(pod)...)
	ApplyDefaults(pod)
	return append(errs, Validate(pod)...), warnings
}

// keepLastGood gives next, the result of new content with errors, the pods of
// prev that next does not yield validly, marked stale: the kubelet would kill
// them, but a typo must not take an appliance's pods down. Config objects
// are kept alike, and an immutable one may not change (checkImmutable). A pod that next
// yields validly takes its new spec; without errors, next stands as it is, so
// removing a document removes its pod once the file is valid again.
func keepLastGood(prev, next *fileResult) *fileResult {
	checkImmutable(prev, next)
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
	for _, o := range next.objects {
		have[o.key()] = true
	}
	for _, o := range prev.objects {
		if !have[o.key()] {
			o.stale = true
			next.objects = append(next.objects, o)
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
	assembleObjects(&snap, &fp, order, results)
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

// assembleObjects adds the files' ConfigMaps and Secrets to snap, where the
// first definition of a kind and namespace/name wins, and fingerprints each
// by its content's hash: a change is sent, its values are kept out.
func assembleObjects(snap *Snapshot, fp *strings.Builder, order []string, results map[string]*fileResult) {
	seen := map[string]string{} // key -> where defined
	for _, file := range order {
		for _, o := range results[file].objects {
			where := fmt.Sprintf("%s:%d", file, o.line)
			ns, name := o.meta()
			if first, dup := seen[o.key()]; dup {
				snap.Errors = append(snap.Errors, &ManifestError{File: file, Line: o.line, Field: "metadata.name",
					Message: fmt.Sprintf("%s %s/%s is already defined in %s", o.kind(), ns, name, first)})
				continue
			}
			seen[o.key()] = where
			if o.cm != nil {
				snap.ConfigMaps = append(snap.ConfigMaps, o.cm)
			} else {
				snap.Secrets = append(snap.Secrets, o.secret)
			}
			snap.Info.Objects = append(snap.Info.Objects, objectInfo(file, o))
			fmt.Fprintf(fp, "object %s %s %t\n", o.key(), o.sum, o.stale)
		}
	}
}
