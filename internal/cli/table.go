package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// tableAccept asks either API for a server-side Table, as kubectl does.
const tableAccept = "application/json;as=Table;g=meta.k8s.io;v=v1"

// printTable prints a server-side Table as kubectl does: upper-case
// headers, priority-0 columns and the wide ones named, an optional
// NAMESPACE column first.
func printTable(w io.Writer, t *metav1.Table, namespaces bool, wide ...string) {
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	var cols []int
	var head []string
	if namespaces {
		head = append(head, "NAMESPACE")
	}
	for i, c := range t.ColumnDefinitions {
		if c.Priority == 0 || slices.Contains(wide, c.Name) {
			cols = append(cols, i)
			head = append(head, strings.ToUpper(c.Name))
		}
	}
	fmt.Fprintln(tw, strings.Join(head, "\t"))
	for _, r := range t.Rows {
		var cells []string
		if namespaces {
			var m metav1.PartialObjectMetadata
			_ = json.Unmarshal(r.Object.Raw, &m)
			cells = append(cells, m.Namespace)
		}
		for _, i := range cols {
			cells = append(cells, fmt.Sprint(r.Cells[i]))
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	tw.Flush()
}
