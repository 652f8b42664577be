package mirror

import (
	"context"
	"encoding/json"
	"net/url"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/noderun/noderun/manifests"
)

// syncPods makes the API server's mirror pods of this node match the
// static pods, as the kubelet's pod manager and mirror client do: one per
// static pod, replaced when its hash differs from the pod's or it is being
// deleted (a deleted mirror pod comes back), deleted when its static pod
// is gone (at the first turn too, which removes the orphans an earlier run
// left), and each one's status written from noderun's.
func (m *Mirror) syncPods(ctx context.Context) {
	var list v1.PodList
	err := m.conn.call(ctx, "GET", "/api/v1/pods?fieldSelector="+url.QueryEscape("spec.nodeName="+m.cfg.NodeName), "", nil, &list)
	m.result("list", err)
	if err != nil {
		return
	}
	mirrors := map[string]*v1.Pod{}
	live := map[string]bool{}
	for i := range list.Items {
		p := &list.Items[i]
		if _, ok := p.Annotations[ConfigMirrorAnnotation]; ok {
			mirrors[p.Namespace+"/"+p.Name] = p
			live[string(p.UID)] = true
		}
	}
	for uid := range m.sent { // mirror pods deleted by others
		if !live[uid] {
			delete(m.sent, uid)
		}
	}
	for _, pod := range current(m.cfg.Source.Pods(), mirrors) {
		key := pod.Namespace + "/" + pod.Name
		mp := mirrors[key]
		delete(mirrors, key)
		hash := pod.Annotations[manifests.ConfigHashAnnotation]
		if mp != nil && (mp.DeletionTimestamp != nil || mp.Annotations[ConfigMirrorAnnotation] != hash) {
			if err := m.deleteMirror(ctx, mp); err != nil {
				if statusCode(err) == 0 {
					return
				}
				continue
			}
			mp = nil
		}
		if mp == nil {
			if mp, err = m.createMirror(ctx, &pod, hash); err != nil {
				if statusCode(err) == 0 {
					return
				}
				continue
			}
		}
		if err := m.writeStatus(ctx, &pod, mp); err != nil && statusCode(err) == 0 {
			return
		}
	}
	for _, orphan := range mirrors {
		if err := m.deleteMirror(ctx, orphan); err != nil && statusCode(err) == 0 {
			return
		}
	}
}

// current keeps one pod per namespace/name, the one its mirror pod
// stands for: while an edited manifest's old pod is torn down, its new
// pod is listed beside it, and, as in the kubelet's pod manager, the name
// is the new pod's (the one not terminating). Mirroring both made each
// turn replace the other's mirror pod, so that the old hash could come
// back with the old pod's Running status after kubeadm upgrade saw it
// change. For the moment both are listed before the old one is marked
// terminating, the pod the mirror pod already stands for is kept.
func current(pods []v1.Pod, mirrors map[string]*v1.Pod) []v1.Pod {
	rank := func(p *v1.Pod) int {
		r := 0
		if p.DeletionTimestamp == nil {
			r += 2
		}
		if mp := mirrors[p.Namespace+"/"+p.Name]; mp != nil && mp.Annotations[ConfigMirrorAnnotation] == p.Annotations[manifests.ConfigHashAnnotation] {
			r++
		}
		return r
	}
	at := map[string]int{}
	var out []v1.Pod
	for _, p := range pods {
		key := p.Namespace + "/" + p.Name
		if i, seen := at[key]; !seen {
			at[key] = len(out)
			out = append(out, p)
		} else if rank(&p) > rank(&out[i]) {
			out[i] = p
		}
	}
	return out
}

// createMirror creates pod's mirror pod: the static pod as noderun runs
// it, marked with its hash and owned by the Node.
func (m *Mirror) createMirror(ctx context.Context, pod *v1.Pod, hash string) (*v1.Pod, error) {
	mp := &v1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}, ObjectMeta: *pod.ObjectMeta.DeepCopy(), Spec: *pod.Spec.DeepCopy()}
	mp.UID, mp.ResourceVersion, mp.CreationTimestamp = "", "", metav1.Time{}
	mp.DeletionTimestamp, mp.DeletionGracePeriodSeconds = nil, nil // noderun's own teardown mark, not the mirror's
	mp.Annotations[ConfigMirrorAnnotation] = hash
	mp.OwnerReferences = m.ownerRefs(true)
	var got v1.Pod
	err := m.conn.call(ctx, "POST", "/api/v1/namespaces/"+url.PathEscape(pod.Namespace)+"/pods", contentJSON, mp, &got)
	m.result("create", err)
	if err != nil {
		return nil, err
	}
	m.cfg.Log.Debug("mirror: mirror pod created", "pod", pod.Namespace+"/"+pod.Name, "hash", hash)
	return &got, nil
}

// deleteMirror deletes a mirror pod at once (grace period 0: its
// containers are the static pod's, which this deletion does not touch),
// only if it is still the same object; one already gone is deleted.
func (m *Mirror) deleteMirror(ctx context.Context, mp *v1.Pod) error {
	grace := int64(0)
	uid := mp.UID
	opts := metav1.DeleteOptions{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "DeleteOptions"},
		GracePeriodSeconds: &grace, Preconditions: &metav1.Preconditions{UID: &uid}}
	err := m.conn.call(ctx, "DELETE", "/api/v1/namespaces/"+url.PathEscape(mp.Namespace)+"/pods/"+url.PathEscape(mp.Name), contentJSON, opts, nil)
	if statusCode(err) == 404 {
		err = nil
	}
	m.result("delete", err)
	delete(m.sent, string(mp.UID))
	return err
}

// writeStatus writes pod's status to its mirror pod unless that status
// was the last written there. The patch names the mirror pod's UID, so
// that it cannot land on a newer pod of the same name.
func (m *Mirror) writeStatus(ctx context.Context, pod *v1.Pod, mp *v1.Pod) error {
	b, err := json.Marshal(pod.Status)
	if err != nil {
		return err
	}
	if m.sent[string(mp.UID)] == string(b) {
		return nil
	}
	patch := struct {
		Metadata struct {
			UID types.UID `json:"uid"`
		} `json:"metadata"`
		Status json.RawMessage `json:"status"`
	}{Status: b}
	patch.Metadata.UID = mp.UID
	err = m.conn.call(ctx, "PATCH", "/api/v1/namespaces/"+url.PathEscape(mp.Namespace)+"/pods/"+url.PathEscape(mp.Name)+"/status", contentMerge, patch, nil)
	m.result("status", err)
	if err == nil {
		m.sent[string(mp.UID)] = string(b)
	}
	return err
}
