package manifests

import (
	"cmp"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
)

// typeErrors finds every value in the document js that cannot decode into
// the Go type t (a string where a number belongs, a bad quantity, a list
// where an object belongs) and names each by its field path. The JSON
// decoder stops at the first such value and names none of them.
func typeErrors(js []byte, t reflect.Type, c chunk) []error {
	var tree any
	if err := json.Unmarshal(js, &tree); err != nil {
		return nil
	}
	var errs []error
	checkType(tree, t, "", &errs)
	locateFields(errs, c)
	slices.SortStableFunc(errs, func(a, b error) int {
		ea, eb := a.(*ManifestError), b.(*ManifestError)
		return cmp.Or(cmp.Compare(ea.Line, eb.Line), cmp.Compare(ea.Column, eb.Column), cmp.Compare(ea.Field, eb.Field))
	})
	return errs
}

var unmarshaler = reflect.TypeFor[json.Unmarshaler]()

// checkType compares the decoded JSON value v with type t at path.
func checkType(v any, t reflect.Type, path string, errs *[]error) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if v == nil {
		return // null leaves a field at its zero value
	}
	if reflect.PointerTo(t).Implements(unmarshaler) {
		// Types with their own syntax (Quantity, IntOrString, Time) say
		// best what is wrong.
		b, _ := json.Marshal(v)
		if err := json.Unmarshal(b, reflect.New(t).Interface()); err != nil {
			addTypeError(errs, path, "%s", strings.TrimPrefix(err.Error(), "json: "))
		}
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		m, ok := v.(map[string]any)
		if !ok {
			addTypeError(errs, path, "must be an object, not %s", describe(v))
			return
		}
		fields := jsonFields(t)
		for k, sub := range m {
			if ft, ok := fields[k]; ok {
				checkType(sub, ft, join(path, k), errs)
			}
		}
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			if _, ok := v.(string); !ok {
				addTypeError(errs, path, "must be a base64 string, not %s", describe(v))
			}
			return
		}
		list, ok := v.([]any)
		if !ok {
			addTypeError(errs, path, "must be a list, not %s", describe(v))
			return
		}
		for i, sub := range list {
			checkType(sub, t.Elem(), fmt.Sprintf("%s[%d]", path, i), errs)
		}
	case reflect.Map:
		m, ok := v.(map[string]any)
		if !ok {
			addTypeError(errs, path, "must be a map, not %s", describe(v))
			return
		}
		for k, sub := range m {
			checkType(sub, t.Elem(), join(path, k), errs)
		}
	case reflect.String:
		if _, ok := v.(string); !ok {
			addTypeError(errs, path, "must be a string, not %s", describe(v))
		}
	case reflect.Bool:
		if _, ok := v.(bool); !ok {
			addTypeError(errs, path, "must be true or false, not %s", describe(v))
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		b, _ := json.Marshal(v)
		if err := json.Unmarshal(b, reflect.New(t).Interface()); err != nil {
			addTypeError(errs, path, "must be an integer that fits %s, not %s", t.Kind(), describe(v))
		}
	case reflect.Float32, reflect.Float64:
		if _, ok := v.(float64); !ok {
			addTypeError(errs, path, "must be a number, not %s", describe(v))
		}
	}
}

// jsonFields maps a struct's JSON names to field types, inline structs
// (such as Volume's VolumeSource) included.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case name == "-":
		case name == "" && (f.Anonymous || strings.Contains(opts, "inline")):
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			for k, v := range jsonFields(ft) {
				out[k] = v
			}
		case name != "":
			out[name] = f.Type
		}
	}
	return out
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func describe(v any) string {
	switch x := v.(type) {
	case string:
		return fmt.Sprintf("the string %q", x)
	case float64, bool:
		return fmt.Sprint(x)
	case []any:
		return "a list"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}

func addTypeError(errs *[]error, path, format string, args ...any) {
	*errs = append(*errs, &ManifestError{Field: path, Message: fmt.Sprintf(format, args...)})
}
