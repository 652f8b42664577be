package kubeapi

import (
	"encoding/json"
	"fmt"
	"strings"
)

// strategicMergePod applies a strategic merge patch to a pod's JSON, as
// far as the ephemeralcontainers subresource needs it: a JSON merge patch
// (maps merged, null deletes) in which spec.ephemeralContainers is merged
// by name (its patchMergeKey) in the order $setElementOrder gives, and
// other lists are replaced. That is what kubectl debug sends
// ({"spec":{"$setElementOrder/ephemeralContainers":[...],
// "ephemeralContainers":[{...}]}}). Other directives are refused by name.
// apimachinery's strategicpatch does it all, but links kube-openapi's
// schema packages: about 3 MB of the binary's budget for one request.
func strategicMergePod(orig, patch []byte) ([]byte, error) {
	var o, p map[string]any
	if err := json.Unmarshal(orig, &o); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(patch, &p); err != nil {
		return nil, fmt.Errorf("the patch is not a JSON object: %w", err)
	}
	out, err := smpMerge(o, p, "")
	if err != nil {
		return nil, err
	}
	return json.Marshal(out)
}

// mergeByName are the lists merged by their items' name.
var mergeByName = map[string]bool{"spec.ephemeralContainers": true}

func smpMerge(o, p map[string]any, path string) (map[string]any, error) {
	if o == nil {
		o = map[string]any{}
	}
	order := map[string][]any{}
	for k, v := range p {
		if list, ok := strings.CutPrefix(k, "$setElementOrder/"); ok {
			items, _ := v.([]any)
			order[list] = items
			continue
		}
		if strings.HasPrefix(k, "$") {
			return nil, fmt.Errorf("%s: the strategic merge patch directive %s is not supported here; send a JSON patch", pathOr(path), k)
		}
	}
	for k, v := range p {
		if strings.HasPrefix(k, "$") {
			continue
		}
		sub := strings.TrimPrefix(path+"."+k, ".")
		switch pv := v.(type) {
		case nil:
			delete(o, k)
		case map[string]any:
			ov, _ := o[k].(map[string]any)
			m, err := smpMerge(ov, pv, sub)
			if err != nil {
				return nil, err
			}
			o[k] = m
		case []any:
			if !mergeByName[sub] {
				o[k] = pv
				continue
			}
			ov, _ := o[k].([]any)
			l, err := mergeNamed(ov, pv, order[k], sub)
			if err != nil {
				return nil, err
			}
			o[k] = l
		default:
			o[k] = pv
		}
	}
	for k := range order {
		if _, ok := p[k]; !ok && mergeByName[strings.TrimPrefix(path+"."+k, ".")] {
			ov, _ := o[k].([]any)
			l, err := mergeNamed(ov, nil, order[k], path+"."+k)
			if err != nil {
				return nil, err
			}
			o[k] = l
		}
	}
	return o, nil
}

// mergeNamed merges the patch's items into the list by name (an item of
// the patch with "$patch": "delete" removes its namesake), then orders
// the list as order names it, the rest after in their order.
func mergeNamed(list, patch, order []any, path string) ([]any, error) {
	byName := map[string]int{}
	for i, it := range list {
		byName[nameOf(it)] = i
	}
	for _, it := range patch {
		m, ok := it.(map[string]any)
		if !ok || nameOf(m) == "" {
			return nil, fmt.Errorf("%s: each item needs a name, its merge key", path)
		}
		name := nameOf(m)
		if d, ok := m["$patch"]; ok {
			if d != "delete" {
				return nil, fmt.Errorf("%s: the directive $patch: %v is not supported here", path, d)
			}
			if i, ok := byName[name]; ok {
				list[i] = nil
			}
			continue
		}
		if i, ok := byName[name]; ok && list[i] != nil {
			old, _ := list[i].(map[string]any)
			merged, err := smpMerge(old, m, path+"["+name+"]")
			if err != nil {
				return nil, err
			}
			list[i] = merged
			continue
		}
		byName[name] = len(list)
		list = append(list, m)
	}
	var out []any
	placed := map[string]bool{}
	for _, it := range order {
		if i, ok := byName[nameOf(it)]; ok && list[i] != nil && !placed[nameOf(it)] {
			out = append(out, list[i])
			placed[nameOf(it)] = true
		}
	}
	for _, it := range list {
		if it != nil && !placed[nameOf(it)] {
			out = append(out, it)
		}
	}
	return out, nil
}

func nameOf(item any) string {
	m, _ := item.(map[string]any)
	s, _ := m["name"].(string)
	return s
}

func pathOr(path string) string {
	if path == "" {
		return "the patch"
	}
	return path
}
