package crilog

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// The collector's socket speaks SOCK_SEQPACKET: one JSON message per
// packet, the pipes' read ends riding along as SCM_RIGHTS. Packets keep
// each message and its descriptors together, which a stream socket would not.
const (
	opRegister = "register" // driver -> collector: a new container's pipes
	opAck      = "ack"      // collector -> driver: the pipes are taken, signal ready
	opFail     = "fail"     // collector -> driver: the log cannot be written
	opHold     = "hold"     // holder -> collector: first message of a holder connection
	opStream   = "stream"   // either way on a holder connection: a stream's pipes
	opEnd      = "end"      // collector -> holder: both pipes reached EOF; close them
	opStats    = "stats"    // holder asks, collector answers with Streams
	opAttach   = "attach"   // an attach -> collector: a stream's output as read, from now on
)

// maxMessage bounds one packet: a stats answer for about a thousand
// streams (a packet must also fit the socket's send buffer, 208 KiB by
// default). Only the holder reads those; what drivers and the holder send
// the collector fits in smallMessage (a log path is at most 4 KiB).
const (
	maxMessage   = 192 << 10
	smallMessage = 16 << 10
)

type message struct {
	Op       string        `json:"op"`
	Key      string        `json:"key,omitempty"`
	Path     string        `json:"path,omitempty"`
	Root     string        `json:"root,omitempty"` // see Target.Root
	Rotation Rotation      `json:"rotation,omitzero"`
	Error    string        `json:"error,omitempty"`
	Streams  []StreamStats `json:"streams,omitempty"`
}

// StreamStats is what the collector counts for one container's output.
type StreamStats struct {
	Key     string `json:"key"`     // <containerd namespace>/<container id>
	Path    string `json:"logPath"` // the CRI log file
	Dropped int64  `json:"droppedRecords"`
	// Dropping is true while writes fail (a full disk): output is being
	// dropped now, not only earlier.
	Dropping bool `json:"dropping"`
}

var errShortMessage = errors.New("crilog: truncated message on the collector socket")

func sendMsg(c *net.UnixConn, m message, fds ...int) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	_, _, err = c.WriteMsgUnix(b, oob, nil)
	return err
}

// recvMsg reads one packet into buf. The descriptors it
// returns are the caller's to close, also when the message is not what it
// expected.
func recvMsg(c *net.UnixConn, buf []byte) (message, []int, error) {
	oob := make([]byte, unix.CmsgSpace(2*4))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return message{}, nil, err
	}
	var fds []int
	if oobn > 0 {
		cmsgs, perr := unix.ParseSocketControlMessage(oob[:oobn])
		if perr != nil {
			return message{}, nil, fmt.Errorf("crilog: control message: %w", perr)
		}
		for i := range cmsgs {
			r, perr := unix.ParseUnixRights(&cmsgs[i])
			if perr == nil {
				fds = append(fds, r...)
			}
		}
	}
	if n == 0 && oobn == 0 {
		return message{}, nil, io.EOF // the peer closed: seqpacket reads 0
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		closeFDs(fds)
		return message{}, nil, errShortMessage
	}
	var m message
	if err := json.Unmarshal(buf[:n], &m); err != nil {
		closeFDs(fds)
		return message{}, nil, fmt.Errorf("crilog: collector message: %w", err)
	}
	return m, fds, nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

func dialCollector(sock string, timeout time.Duration) (*net.UnixConn, error) {
	d := net.Dialer{Timeout: timeout}
	c, err := d.Dial("unixpacket", sock)
	if err != nil {
		return nil, err
	}
	return c.(*net.UnixConn), nil
}
