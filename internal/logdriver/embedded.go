//go:build noderun_logdriver

package logdriver

import _ "embed"

// embedded is the driver make build compiled for this binary's platform,
// gzipped.
//
//go:embed bin/log-driver.gz
var embedded []byte
