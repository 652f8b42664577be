package crilog

import (
	"fmt"
	"log/syslog"
	"os"
)

// SyslogTag names the driver's messages in syslog: journalctl -t noderun-log-driver.
const SyslogTag = "noderun-log-driver"

// Syslog returns a report function that sends "<logPath>: <error>" at
// priority daemon.err to the syslog socket at addr (a unix datagram socket;
// "" for the local one). It connects at the first failure, so a healthy
// driver holds no socket, and falls back to stderr when syslog is absent.
func Syslog(addr, logPath string) func(error) {
	network := ""
	if addr != "" {
		network = "unixgram"
	}
	return func(err error) {
		msg := fmt.Sprintf("%s: %v", logPath, err)
		w, derr := syslog.Dial(network, addr, syslog.LOG_ERR|syslog.LOG_DAEMON, SyslogTag)
		if derr == nil {
			derr = w.Err(msg)
			w.Close()
		}
		if derr != nil {
			fmt.Fprintf(os.Stderr, "%s: %s (syslog: %v)\n", SyslogTag, msg, derr)
		}
	}
}
