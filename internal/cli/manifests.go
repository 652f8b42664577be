package cli

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"
	"k8s.io/apimachinery/pkg/util/duration"

	"github.com/noderun/noderun/kubeapi"
	"github.com/noderun/noderun/manifests"
)

func manifestsCommand() *cli.Command {
	return &cli.Command{
		Name:        "manifests",
		Usage:       "list manifest sources with their files or URL, pods and errors, from the status API",
		Description: "See docs/operating.md, Manifest sources, and docs/troubleshooting.md.",
		Action: func(c *cli.Context) error {
			var list kubeapi.ManifestSources
			if err := statusClient(c).get(c.Context, "/manifests", nil, &list); err != nil {
				return err
			}
			printSources(c.App.Writer, list.Sources, time.Now())
			return nil
		},
	}
}

// printSources writes a table of sources, then their pods, then errors.
func printSources(w io.Writer, sources []manifests.SourceInfo, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	fmt.Fprintln(tw, "SOURCE\tREAD\tETAG\tPODS\tERRORS")
	for _, s := range sources {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\n", s.Source, ago(lastRead(s), now), orNone(s.ETag), len(s.Pods), len(s.Errors))
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	fmt.Fprintln(tw, "POD\tUID\tFROM")
	for _, s := range sources {
		for _, p := range s.Pods {
			fmt.Fprintf(tw, "%s/%s\t%s\t%s\n", p.Namespace, p.Name, p.UID, from(s.URL, p.File, p.Line, p.LastKnownGood))
		}
	}
	tw.Flush()
	printObjects(w, sources)
	for _, s := range sources {
		for _, e := range s.Errors {
			fmt.Fprintf(w, "error: %s\n", e)
		}
	}
}

// from is where a pod or object is defined: file:line, or the URL.
func from(url, file string, line int, lastGood bool) string {
	where := url
	if file != "" {
		where = fmt.Sprintf("%s:%d", file, line)
	}
	if lastGood {
		where += " (last known good)"
	}
	return where
}

// printObjects lists the sources' ConfigMaps and Secrets, if any: where
// each is defined, never what it holds.
func printObjects(w io.Writer, sources []manifests.SourceInfo) {
	var rows []string
	for _, s := range sources {
		for _, o := range s.Objects {
			rows = append(rows, fmt.Sprintf("%s\t%s/%s\t%s\n", o.Kind, o.Namespace, o.Name, from(s.URL, o.File, o.Line, o.LastKnownGood)))
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	fmt.Fprintln(tw, "KIND\tOBJECT\tFROM")
	for _, r := range rows {
		fmt.Fprint(tw, r)
	}
	tw.Flush()
}

// lastRead is when a source last read new content: its latest file or body.
func lastRead(s manifests.SourceInfo) time.Time {
	t := s.ReadAt
	for _, f := range s.Files {
		if f.ReadAt.After(t) {
			t = f.ReadAt
		}
	}
	return t
}

func ago(t, now time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return duration.HumanDuration(now.Sub(t)) + " ago"
}

func orNone(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
