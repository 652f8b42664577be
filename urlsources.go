package main

import (
	"fmt"
	"log/slog"
	"slices"
	"strconv"

	"github.com/urfave/cli/v2"

	nrcli "github.com/noderun/noderun/internal/cli"
	"github.com/noderun/noderun/manifests"
)

// newURLSources builds one source per --manifest-url; the last good response
// of each is kept under stateDir.
func newURLSources(c *cli.Context, nodeName, stateDir string, log *slog.Logger) ([]*manifests.URLSource, error) {
	opts, err := nrcli.URLOptions(c)
	if err != nil {
		return nil, err
	}
	opts = append(opts, manifests.WithCheckInterval(c.Duration("url-check-interval")),
		manifests.WithStateDir(stateDir), manifests.WithURLLogger(log))
	var out []*manifests.URLSource
	var seen []string
	shown := map[string]int{} // redacted URL -> how many show as it
	for _, u := range c.StringSlice("manifest-url") {
		if slices.Contains(seen, u) {
			continue
		}
		// The engine waits for one snapshot per distinct source name, and
		// the name hides credentials and query values: two URLs that
		// differ only there must not share one, or it would wait forever.
		display := manifests.RedactURL(u)
		for _, prev := range seen {
			if manifests.SameURL(prev, u) {
				return nil, fmt.Errorf("--manifest-url %s is given twice, differing only in credentials or #fragment; give it once", display)
			}
		}
		seen = append(seen, u)
		srcOpts := opts
		if shown[display]++; shown[display] > 1 {
			// Differing query values name different resources.
			srcOpts = append(slices.Clip(opts), manifests.WithDisplayTag(strconv.Itoa(shown[display])))
		}
		s, err := manifests.NewURLSource(u, nodeName, srcOpts...)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}
