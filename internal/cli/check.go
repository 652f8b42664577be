package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/internal/admission"
	"github.com/noderun/noderun/manifests"
)

// errCheckFailed is what `noderun check` returns when a manifest has errors,
// so the process exits 1.
var errCheckFailed = errors.New("manifests have errors")

// URLFlags are the URL source's request settings, shared by the node and
// `noderun check`; a function, since a flag value cannot be shared.
func URLFlags() []cli.Flag {
	env := func(name string) []string { return []string{"NODERUN_" + name} }
	return []cli.Flag{
		&cli.StringSliceFlag{Name: "manifest-url-header", Usage: `"Name: value" header for manifest URL requests (repeatable; visible in ps, so use --manifest-url-header-file for tokens)`, EnvVars: env("MANIFEST_URL_HEADER")},
		&cli.StringFlag{Name: "manifest-url-header-file", Usage: `file of "Name: value" header lines for manifest URL requests, mode 600 or stricter`, EnvVars: env("MANIFEST_URL_HEADER_FILE")},
		&cli.DurationFlag{Name: "url-timeout", Value: 10 * time.Second, Usage: "bound on each manifest URL request", EnvVars: env("URL_TIMEOUT")},
		&cli.StringFlag{Name: "url-ca-file", Usage: "PEM CAs trusted for manifest URLs, instead of the system's", EnvVars: env("URL_CA_FILE")},
		&cli.StringFlag{Name: "url-client-cert", Usage: "PEM client certificate for manifest URLs", EnvVars: env("URL_CLIENT_CERT")},
		&cli.StringFlag{Name: "url-client-key", Usage: "PEM key of --url-client-cert", EnvVars: env("URL_CLIENT_KEY")},
	}
}

// LocalConfigFlag is --local-config-objects, shared by the node and
// `noderun check`: a function, since a flag value cannot be shared.
func LocalConfigFlag() cli.Flag {
	return &cli.BoolFlag{Name: "local-config-objects", EnvVars: []string{"NODERUN_LOCAL_CONFIG_OBJECTS"},
		Usage: "read ConfigMap and Secret documents (v1) from the manifest sources and let pods of their namespace use them " +
			"(configMap, secret and projected volumes, envFrom, configMapKeyRef, secretKeyRef); off, such pods are refused, " +
			"as the kubelet refuses static pods that reference API objects"}
}

// FileOptions are the file source options the flags give.
func FileOptions(c *cli.Context) []manifests.FileOption {
	if c.Bool("local-config-objects") {
		return []manifests.FileOption{manifests.WithLocalConfigObjects()}
	}
	return nil
}

// URLOptions turns URLFlags (and LocalConfigFlag) into URLSource options.
func URLOptions(c *cli.Context) ([]manifests.URLOption, error) {
	opts := []manifests.URLOption{
		manifests.WithTimeout(c.Duration("url-timeout")),
		manifests.WithTLSFiles(c.String("url-ca-file"), c.String("url-client-cert"), c.String("url-client-key")),
	}
	if c.Bool("local-config-objects") {
		opts = append(opts, manifests.WithURLLocalConfigObjects())
	}
	for _, h := range c.StringSlice("manifest-url-header") {
		name, value, err := manifests.ParseHeader(h)
		if err != nil {
			return nil, fmt.Errorf("--manifest-url-header: %w", err)
		}
		opts = append(opts, manifests.WithHeader(name, value))
	}
	if file := c.String("manifest-url-header-file"); file != "" {
		h, err := manifests.ReadHeaderFile(file)
		if err != nil {
			return nil, fmt.Errorf("--manifest-url-header-file: %w", err)
		}
		for name, values := range h {
			for _, v := range values {
				opts = append(opts, manifests.WithHeader(name, v))
			}
		}
	}
	return opts, nil
}

// DefaultNodeName is the hostname, lowercased: the node's name and the one
// `check` names pods for.
func DefaultNodeName() string {
	h, err := os.Hostname()
	if err != nil {
		return "localhost"
	}
	return strings.ToLower(h)
}

func checkCommand() *cli.Command {
	return &cli.Command{
		Name:        "check",
		Usage:       "decode, default and validate manifests offline (a URL is fetched once); exit 1 on any error",
		Description: "Needs neither root nor containerd. See docs/troubleshooting.md, Manifest errors, and docs/reference/fields.md.",
		ArgsUsage:   "PATH|URL...",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "output", Aliases: []string{"o"}, Value: "text", Usage: "text or json"},
			&cli.StringFlag{Name: "node-name", Value: DefaultNodeName(), DefaultText: "the hostname, lowercased", Usage: "node name the pods are named for", EnvVars: []string{"NODERUN_NODE_NAME"}},
			&cli.StringFlag{Name: "node-labels", Usage: "the node's --node-labels: a pod whose nodeSelector or required node affinity they cannot match is warned of", EnvVars: []string{"NODERUN_NODE_LABELS"}},
			LocalConfigFlag(),
		}, URLFlags()...),
		Action: runCheck,
	}
}

func runCheck(c *cli.Context) error {
	if c.NArg() == 0 {
		return errors.New("check: give at least one PATH or URL")
	}
	output := c.String("output")
	if output != "text" && output != "json" {
		return fmt.Errorf("check: --output %q is neither text nor json", output)
	}
	opts, err := URLOptions(c)
	if err != nil {
		return err
	}
	extra, err := admission.ParseNodeLabels(c.String("node-labels"))
	if err != nil {
		return fmt.Errorf("check: --node-labels: %w", err)
	}
	labels := admission.NodeLabels(c.String("node-name"), extra)
	var snaps []manifests.Snapshot
	var shown []string
	for _, in := range c.Args().Slice() {
		var snap manifests.Snapshot
		if strings.HasPrefix(in, "http://") || strings.HasPrefix(in, "https://") {
			snap = manifests.CheckURL(c.Context, in, c.String("node-name"), opts...)
			in = manifests.RedactURL(in) // the output may be pasted or logged
		} else {
			snap = manifests.CheckPath(in, c.String("node-name"), FileOptions(c)...)
		}
		snap.Warnings = append(snap.Warnings, admissionWarnings(snap, c.String("node-name"), labels)...)
		snaps, shown = append(snaps, snap), append(shown, in)
	}
	crossSourceErrors(snaps)
	var results []checkResult
	nErrs := 0
	for i, snap := range snaps {
		results = append(results, newCheckResult(shown[i], snap))
		nErrs += len(snap.Errors)
	}
	if output == "json" {
		enc := json.NewEncoder(c.App.Writer)
		enc.SetIndent("", "  ")
		if err := enc.Encode(checkReport{OK: nErrs == 0, Inputs: results}); err != nil {
			return err
		}
	} else {
		printCheck(c.App.Writer, c.App.ErrWriter, results)
	}
	if nErrs > 0 {
		return fmt.Errorf("check: %w: %d", errCheckFailed, nErrs)
	}
	return nil
}

// admissionWarnings names the pods the node would reject for their
// nodeSelector or required node affinity with the labels it has now (a
// warning, not an error, as labels may change before the pod arrives), and
// for a spec.os of another OS (a valid manifest the API server accepts).
func admissionWarnings(snap manifests.Snapshot, nodeName string, labels map[string]string) []error {
	var out []error
	for _, p := range snap.Pods {
		if podOS := p.Spec.OS; podOS != nil && string(podOS.Name) != runtime.GOOS {
			out = append(out, locate(snap, p, &manifests.ManifestError{Field: "spec.os.name",
				Message: fmt.Sprintf("%s: the pod would be rejected at admission (PodOSNotSupported): this node runs %s", podOS.Name, runtime.GOOS)}))
		}
		if admission.MatchesNode(p, nodeName, labels) {
			continue
		}
		field := "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
		if sel := p.DeepCopy(); sel.Spec.Affinity != nil {
			sel.Spec.Affinity = nil
			if !admission.MatchesNode(sel, nodeName, labels) {
				field = "spec.nodeSelector"
			}
		} else {
			field = "spec.nodeSelector"
		}
		out = append(out, locate(snap, p, &manifests.ManifestError{Field: field, Message: "the node's labels (" + formatLabels(labels) +
			") do not match it: the pod would be rejected at admission (NodeAffinity) unless they change (--node-labels)"}))
	}
	return out
}

// locate gives me the file and line of the pod p in snap.
func locate(snap manifests.Snapshot, p *v1.Pod, me *manifests.ManifestError) *manifests.ManifestError {
	for _, info := range snap.Info.Pods {
		if info.UID == p.UID {
			me.File, me.Line = info.File, info.Line
		}
	}
	return me
}

// crossSourceErrors adds to snaps the errors seen across all of them, taken
// as the node's whole set of manifests: a wait-for name none of them
// defines, a cycle across inputs, and a ConfigMap, Secret or key a pod
// needs that none of them defines.
func crossSourceErrors(snaps []manifests.Snapshot) {
	var all []*v1.Pod
	for _, s := range snaps {
		all = append(all, s.Pods...)
	}
	errs := manifests.DependencyErrors(all, true)
	refs := manifests.ReferenceErrors(snaps)
	for i := range snaps {
		s := &snaps[i]
		for _, info := range s.Info.Pods {
			found := refs[info.UID]
			if me := errs[info.UID]; me != nil {
				found = append(found, me)
			}
			for _, me := range found {
				me.File, me.Line = info.File, info.Line
				s.Errors = append(s.Errors, me)
				s.Info.Errors = append(s.Info.Errors, me.Error())
			}
		}
	}
}

// formatLabels is labels as key=value, sorted, comma-separated.
func formatLabels(labels map[string]string) string {
	var kv []string
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		kv = append(kv, k+"="+labels[k])
	}
	return strings.Join(kv, ",")
}

// checkReport is `noderun check --output json`.
type checkReport struct {
	OK     bool          `json:"ok"`
	Inputs []checkResult `json:"inputs"`
}

type checkResult struct {
	Input    string                 `json:"input"`
	Pods     []manifests.PodInfo    `json:"pods"`
	Objects  []manifests.ObjectInfo `json:"objects,omitempty"` // ConfigMaps and Secrets: names only
	Errors   []checkError           `json:"errors"`
	Warnings []checkError           `json:"warnings"` // fields ignored on purpose
}

type checkError struct {
	File    string `json:"file,omitempty"`
	Line    int    `json:"line,omitempty"`
	Column  int    `json:"column,omitempty"`
	Field   string `json:"field,omitempty"`
	Message string `json:"message"`
	Text    string `json:"text"` // file:line: field: message
}

func newCheckResult(input string, snap manifests.Snapshot) checkResult {
	return checkResult{Input: input, Pods: snap.Info.Pods, Objects: snap.Info.Objects, Errors: checkErrors(snap.Errors), Warnings: checkErrors(snap.Warnings)}
}

func checkErrors(errs []error) []checkError {
	out := []checkError{}
	for _, err := range errs {
		ce := checkError{Message: err.Error(), Text: err.Error()}
		var me *manifests.ManifestError
		if errors.As(err, &me) {
			ce.File, ce.Line, ce.Column, ce.Field, ce.Message = me.File, me.Line, me.Column, me.Field, me.Detail()
		}
		out = append(out, ce)
	}
	return out
}

// printCheck writes errors compiler-style to errw and one OK line per good
// input to w.
func printCheck(w, errw io.Writer, results []checkResult) {
	for _, r := range results {
		for _, e := range r.Errors {
			fmt.Fprintln(errw, e.Text)
		}
		for _, e := range r.Warnings {
			fmt.Fprintln(errw, "warning: "+e.Text)
		}
		if len(r.Errors) > 0 {
			continue
		}
		var names []string
		for _, p := range r.Pods {
			names = append(names, p.Namespace+"/"+p.Name)
		}
		fmt.Fprintf(w, "%s: OK, %d pods", r.Input, len(r.Pods))
		if len(names) > 0 {
			fmt.Fprintf(w, " (%s)", strings.Join(names, ", "))
		}
		if len(r.Objects) > 0 {
			var objs []string
			for _, o := range r.Objects {
				objs = append(objs, o.Kind+" "+o.Namespace+"/"+o.Name)
			}
			fmt.Fprintf(w, ", %d config objects (%s)", len(r.Objects), strings.Join(objs, ", "))
		}
		fmt.Fprintln(w)
	}
}
