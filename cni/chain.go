package cni

import (
	"encoding/json"
	"fmt"

	"github.com/containernetworking/cni/libcni"
)

// podChain returns noderun's default config with only the plugins the pod
// needs: portmap only with hostPorts, bandwidth only with limits, and never
// loopback, since CreateNamespaces sets "lo" up in the new netns itself.
// Each of them is a plugin exec (some 20 ms) that does nothing for a pod
// without them. With nodeMasq the node-wide masquerade covers the pod, and
// the bridge plugin makes no rules of its own (masq.go). libcni caches the
// list's bytes with the ADD, so DEL, CHECK and GC of the pod run exactly
// the chain that added it.
func podChain(list *libcni.NetworkConfigList, a Attachment, nodeMasq bool) (*libcni.NetworkConfigList, error) {
	skip := map[string]bool{"loopback": true, "portmap": len(a.PortMappings) == 0, "bandwidth": a.Bandwidth == nil}
	var conf map[string]json.RawMessage
	if err := json.Unmarshal(list.Bytes, &conf); err != nil {
		return nil, fmt.Errorf("default config: %w", err)
	}
	var plugins []json.RawMessage
	if err := json.Unmarshal(conf["plugins"], &plugins); err != nil {
		return nil, fmt.Errorf("default config plugins: %w", err)
	}
	kept := plugins[:0]
	for i, p := range plugins {
		typ := list.Plugins[i].Network.Type
		if skip[typ] {
			continue
		}
		if typ == "bridge" && nodeMasq {
			var conf map[string]json.RawMessage
			if err := json.Unmarshal(p, &conf); err != nil {
				return nil, fmt.Errorf("default config bridge: %w", err)
			}
			conf["ipMasq"] = json.RawMessage("false")
			var err error
			if p, err = json.Marshal(conf); err != nil {
				return nil, err
			}
		}
		kept = append(kept, p)
	}
	var err error
	if conf["plugins"], err = json.Marshal(kept); err != nil {
		return nil, err
	}
	data, err := json.Marshal(conf)
	if err != nil {
		return nil, err
	}
	return libcni.NetworkConfFromBytes(data)
}
