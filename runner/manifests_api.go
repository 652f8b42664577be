package runner

import (
	"encoding/json"
	"net/http"

	"github.com/noderun/noderun/manifests"
)

// ManifestSources is the answer of GET /manifests.
type ManifestSources struct {
	Sources []manifests.SourceInfo `json:"sources"`
}

// serveManifests shows every source with what it read, the pods it yields
// and its errors, so a bad manifest is visible without reading logs.
func (e *Engine) serveManifests(rw http.ResponseWriter, _ *http.Request) {
	rw.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(rw).Encode(ManifestSources{Sources: e.Sources()})
}
