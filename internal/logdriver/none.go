//go:build !noderun_logdriver

package logdriver

// embedded is empty: built without the driver (see Install).
var embedded []byte
