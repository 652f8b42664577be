// Package manifests turns Pod manifests into the pods a node runs without an
// API server, as the kubelet does for static pods: it decodes, defaults,
// validates and identifies them, and FileSource watches files for them.
// With --local-config-objects it also reads the ConfigMap and Secret
// documents beside them (objects.go), checked as the API server would.
package manifests

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// document is one decoded pod, or config object, and where it came from.
type document struct {
	pod   *v1.Pod
	obj   *objectEntry // a ConfigMap or Secret instead of a pod
	raw   []byte       // the pod's canonical JSON, input to its UID
	line  int          // first line of the document that held it
	chunk chunk        // the document's text, to find fields in
}

// chunk is the text of one `---`-separated document.
type chunk struct {
	text []byte
	line int // line number of text's first line in the file
}

// Decode reads Pods from YAML or JSON, one per document or per PodList item.
// Empty documents, and ConfigMap and Secret documents, are skipped. Decoding is strict: unknown and duplicate
// fields are errors. Decode returns the pods of every good document together
// with an error joining one *ManifestError per problem.
func Decode(data []byte) ([]*v1.Pod, error) {
	docs, errs := decodeDocuments(data)
	var pods []*v1.Pod
	for _, d := range docs {
		if d.pod != nil {
			pods = append(pods, d.pod)
		}
	}
	return pods, errors.Join(errs...)
}

func decodeDocuments(data []byte) ([]document, []error) {
	var docs []document
	var errs []error
	for _, c := range splitDocuments(data) {
		d, err := decodeChunk(c)
		docs = append(docs, d...)
		errs = append(errs, err...)
	}
	return docs, errs
}

// splitDocuments cuts data at `---` lines. A marker at column 0 always ends
// the previous document in YAML, even inside a block scalar, so a line scan
// is exact and keeps the line numbers the YAML parser loses.
func splitDocuments(data []byte) []chunk {
	var chunks []chunk
	cur := chunk{line: 1}
	for i, l := range bytes.SplitAfter(data, []byte("\n")) {
		rest, ok := separator(l)
		if !ok {
			cur.text = append(cur.text, l...)
			continue
		}
		chunks = append(chunks, cur)
		if rest != nil {
			cur = chunk{text: rest, line: i + 1}
		} else {
			cur = chunk{line: i + 2}
		}
	}
	return append(chunks, cur)
}

// separator reports whether l is a `---` line and returns any content that
// follows the marker on the same line (as in `--- {kind: Pod, ...}`).
func separator(l []byte) (rest []byte, ok bool) {
	if !bytes.HasPrefix(l, []byte("---")) {
		return nil, false
	}
	tail := l[3:]
	if len(tail) > 0 && !bytes.ContainsRune([]byte(" \t\r\n"), rune(tail[0])) {
		return nil, false
	}
	if t := bytes.TrimSpace(tail); len(t) == 0 || t[0] == '#' {
		return nil, true
	}
	return tail, true
}

// firstContentLine is where a document visibly starts: its first line that is
// neither blank nor a comment.
func firstContentLine(c chunk) int {
	for i, l := range bytes.Split(c.text, []byte("\n")) {
		if t := bytes.TrimSpace(l); len(t) > 0 && t[0] != '#' {
			return c.line + i
		}
	}
	return c.line
}

func decodeChunk(c chunk) ([]document, []error) {
	line := firstContentLine(c)
	js, err := yaml.YAMLToJSONStrict(c.text)
	if err != nil {
		return nil, []error{yamlError(err, c, line)}
	}
	if bytes.Equal(js, []byte("null")) {
		return nil, nil
	}
	var tm struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(js, &tm); err != nil {
		return nil, []error{&ManifestError{Line: line, Message: "document must be an object with apiVersion and kind", Err: err}}
	}
	if tm.APIVersion != "v1" {
		return nil, []error{&ManifestError{Line: line, Field: "apiVersion", Message: fmt.Sprintf("unsupported apiVersion %q (want v1)", tm.APIVersion)}}
	}
	var docs []document
	var errs []error
	switch tm.Kind {
	case "Pod":
		docs, errs = decodePod(js, c)
	case "PodList":
		docs, errs = decodePodList(js, c)
	case KindConfigMap, KindSecret:
		docs, errs = decodeObject(tm.Kind, js, c)
	default:
		return nil, []error{&ManifestError{Line: line, Field: "kind", Message: fmt.Sprintf("unsupported kind %q (want Pod or PodList)", tm.Kind)}}
	}
	for i := range docs {
		docs[i].line, docs[i].chunk = line, c
	}
	locate(errs, "", line)
	return docs, errs
}

// yamlError turns a parser error into a ManifestError whose line numbers
// count from the top of the file rather than the document. An error at the
// end of input is put on the document's last line, where the parser may
// count one more.
func yamlError(err error, c chunk, fallback int) *ManifestError {
	lineRE := regexp.MustCompile(`line \d+`)
	last := c.line + bytes.Count(bytes.TrimRight(c.text, "\n"), []byte("\n"))
	absolute := func(m string) int {
		n, _ := strconv.Atoi(strings.TrimPrefix(m, "line "))
		return min(c.line+n-1, last)
	}
	me := &ManifestError{Line: fallback, Err: err}
	msg := strings.Join(strings.Fields(strings.TrimPrefix(err.Error(), "yaml: ")), " ")
	if m := lineRE.FindString(msg); m != "" {
		me.Line = absolute(m)
	}
	me.Message = "invalid YAML: " + lineRE.ReplaceAllStringFunc(msg, func(m string) string {
		return "line " + strconv.Itoa(absolute(m))
	})
	return me
}

func decodePod(js []byte, c chunk) ([]document, []error) {
	pod := &v1.Pod{}
	if errs := decodeStrict(js, pod, c); len(errs) > 0 {
		return nil, errs
	}
	return []document{{pod: pod, raw: js}}, nil
}

func decodePodList(js []byte, c chunk) ([]document, []error) {
	var list v1.PodList
	if errs := decodeStrict(js, &list, c); len(errs) > 0 {
		return nil, errs
	}
	// Each item's own JSON is its identity, so that adding a pod to a list
	// does not change the UIDs of the others.
	var raw struct {
		Items []json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal(js, &raw); err != nil {
		return nil, []error{&ManifestError{Err: err}}
	}
	var docs []document
	var errs []error
	for i := range list.Items {
		item := &list.Items[i]
		if (item.Kind != "" && item.Kind != "Pod") || (item.APIVersion != "" && item.APIVersion != "v1") {
			errs = append(errs, &ManifestError{Field: fmt.Sprintf("items[%d].kind", i), Message: "PodList items must be v1 Pods"})
			continue
		}
		docs = append(docs, document{pod: item, raw: raw.Items[i]})
	}
	return docs, errs
}

// decodeStrict decodes case-sensitively like the API server and reports each
// unknown field with its path and, best effort, the line of its key.
func decodeStrict(js []byte, v any, c chunk) []error {
	strictErrs, err := sigsjson.UnmarshalStrict(js, v, sigsjson.DisallowUnknownFields)
	if err != nil {
		if errs := typeErrors(js, reflect.TypeOf(v).Elem(), c); len(errs) > 0 {
			return errs
		}
		return []error{&ManifestError{Err: err}}
	}
	errs := make([]error, 0, len(strictErrs))
	for _, se := range strictErrs {
		var fe sigsjson.FieldError
		if !errors.As(se, &fe) {
			errs = append(errs, &ManifestError{Err: se})
			continue
		}
		line, col := keyPos(c, fe.FieldPath())
		errs = append(errs, &ManifestError{
			Line:    line,
			Column:  col,
			Field:   fe.FieldPath(),
			Message: "unknown field",
			Err:     se,
		})
	}
	return errs
}

// keyPos finds the line and column of the key at path by searching for each
// key of the path in turn, each after the previous one; an index [N] skips
// to the N-th item of a block sequence. It returns 0, 0 when a key is not
// found.
func keyPos(c chunk, path string) (line, col int) {
	lines := strings.Split(string(c.text), "\n")
	at, atCol := -1, 0
	for _, key := range strings.Split(path, ".") {
		index := -1
		if i := strings.IndexByte(key, '['); i >= 0 {
			index, _ = strconv.Atoi(strings.TrimSuffix(key[i+1:], "]"))
			key = key[:i]
		}
		re := regexp.MustCompile(`(^|[\s{,])["']?` + regexp.QuoteMeta(key) + `["']?\s*:`)
		found := false
		for i := max(at, 0); i < len(lines) && !found; i++ {
			if loc := re.FindStringIndex(lines[i]); loc != nil {
				at, found = i, true
				atCol = loc[0] + len(lines[i][loc[0]:]) - len(strings.TrimLeft(lines[i][loc[0]:], " \t{,")) + 1
			}
		}
		if !found {
			return 0, 0
		}
		if index > 0 {
			at, atCol = nthItem(lines, at, index)
		}
	}
	return c.line + at, atCol
}

// nthItem finds the n-th (from 0) "- " item of the block sequence that
// follows the key on line from, or stays on from (flow style).
func nthItem(lines []string, from, n int) (int, int) {
	indent := -1
	seen := -1
	for i := from + 1; i < len(lines); i++ {
		t := strings.TrimLeft(lines[i], " ")
		if t == "" || t[0] == '#' {
			continue
		}
		d := len(lines[i]) - len(t)
		if !strings.HasPrefix(t, "- ") && t != "-" {
			if indent < 0 || d <= indent {
				break
			}
			continue
		}
		if indent < 0 {
			indent = d
		}
		if d == indent {
			if seen++; seen == n {
				return i, d + 3
			}
		}
	}
	return from, 1
}
