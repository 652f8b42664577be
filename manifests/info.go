package manifests

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Source kinds in SourceInfo.Kind.
const (
	KindFile = "file"
	KindURL  = "url"
)

// SourceInfo tells people what a source reads and yields: the status API's
// GET /manifests. Times change only when content changes, so that a source
// whose manifests stay the same sends nothing.
type SourceInfo struct {
	Source       string     `json:"source"`
	Kind         string     `json:"kind"`
	Path         string     `json:"path,omitempty"`
	URL          string     `json:"url,omitempty"` // without credentials
	Files        []FileInfo `json:"files,omitempty"`
	ETag         string     `json:"etag,omitempty"`
	LastModified string     `json:"lastModified,omitempty"`
	ReadAt       time.Time  `json:"readAt,omitzero"` // URL: when the body in use was fetched
	Pods         []PodInfo  `json:"pods"`
	// Objects are the ConfigMaps and Secrets it yields: names, never data.
	Objects  []ObjectInfo `json:"objects,omitempty"`
	Errors   []string     `json:"errors,omitempty"`
	Warnings []string     `json:"warnings,omitempty"`
}

// FileInfo is one manifest file of a file source.
type FileInfo struct {
	Path   string    `json:"path"`
	ReadAt time.Time `json:"readAt,omitzero"` // when the content in use was read
}

// PodInfo is one pod a source yields.
type PodInfo struct {
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	UID       types.UID `json:"uid"`
	Hash      string    `json:"hash"` // the config.hash annotation
	File      string    `json:"file,omitempty"`
	Line      int       `json:"line,omitempty"`
	// LastKnownGood: the manifest now has errors, so the pod keeps the last
	// spec that was valid.
	LastKnownGood bool `json:"lastKnownGood,omitempty"`
}

func podInfo(file string, e entry) PodInfo {
	return PodInfo{
		Namespace: e.pod.Namespace, Name: e.pod.Name, UID: e.pod.UID,
		Hash: e.pod.Annotations[ConfigHashAnnotation], File: file, Line: e.line, LastKnownGood: e.stale,
	}
}

// emitter sends a source's snapshots: only when they differ from the last
// one sent (or when forced), logging each change once.
type emitter struct {
	last    string // fingerprint of the last snapshot sent
	changes changeLog
}

// emit reports false if ctx ended before the snapshot could be sent.
func (e *emitter) emit(ctx context.Context, out chan<- Snapshot, snap Snapshot, fingerprint string, force bool, log *slog.Logger) bool {
	if !force && fingerprint == e.last {
		return true
	}
	select {
	case out <- snap:
		e.last = fingerprint
		e.changes.report(log, snap)
		return true
	case <-ctx.Done():
		return false
	}
}

// changeLog remembers what a source last reported, so that each pod change
// and each error is logged once, when it happens, and not at every re-list.
type changeLog struct {
	pods map[types.UID]string // UID -> namespace/name
	errs map[string]bool
}

func (c *changeLog) report(log *slog.Logger, snap Snapshot) {
	pods := map[types.UID]string{}
	for _, p := range snap.Pods {
		pods[p.UID] = p.Namespace + "/" + p.Name
	}
	errs := map[string]bool{}
	for _, err := range snap.Errors {
		errs[err.Error()] = true
	}
	for _, w := range snap.Warnings {
		if !c.errs["warning "+w.Error()] {
			log.Warn("manifest field ignored", "source", snap.Source, "warning", w)
		}
		errs["warning "+w.Error()] = true
	}
	logPodChanges(log, snap.Source, c.pods, pods)
	for _, e := range slices.Sorted(maps.Keys(errs)) {
		if !c.errs[e] && !strings.HasPrefix(e, "warning ") {
			log.Warn("manifest error", "source", snap.Source, "err", e)
		}
	}
	for _, e := range slices.Sorted(maps.Keys(c.errs)) {
		if !errs[e] && !strings.HasPrefix(e, "warning ") {
			log.Info("manifest error resolved", "source", snap.Source, "err", e)
		}
	}
	c.pods, c.errs = pods, errs
}

// logPodChanges logs pods added, removed and updated (same name, new UID).
func logPodChanges(log *slog.Logger, source string, before, after map[types.UID]string) {
	names := func(m map[types.UID]string) map[string]bool {
		out := map[string]bool{}
		for _, n := range m {
			out[n] = true
		}
		return out
	}
	namesBefore, namesAfter := names(before), names(after)
	for _, uid := range slices.Sorted(maps.Keys(after)) {
		if _, ok := before[uid]; ok {
			continue
		}
		msg := "pod added"
		if namesBefore[after[uid]] {
			msg = "pod updated"
		}
		log.Info(msg, "source", source, "pod", after[uid], "uid", uid)
	}
	for _, uid := range slices.Sorted(maps.Keys(before)) {
		if _, ok := after[uid]; !ok && !namesAfter[before[uid]] {
			log.Info("pod removed", "source", source, "pod", before[uid], "uid", uid)
		}
	}
}

// podKey is how last-known-good matches a pod across versions of a file.
func podKey(p *v1.Pod) string { return p.Namespace + "/" + p.Name }
