package linkemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// The control protocol: a client connects to the daemon's unix socket,
// writes one JSON request on one line and reads one JSON response line.
//
//	{"op":"set","queue":3,"delay_us":10000,"jitter_us":0,"loss":0}
//	{"op":"status"}
//
// "op" defaults to "set". The response is {"ok":true} (with "queues" for
// status) or {"ok":false,"error":"..."}.

// QueueSpec is one queue with its parameters in wire form: the control
// request for "set", and a queue entry of a linkd config file.
type QueueSpec struct {
	Queue    uint16  `json:"queue"`
	DelayUS  int64   `json:"delay_us"`
	JitterUS int64   `json:"jitter_us"`
	Loss     float64 `json:"loss"`
}

// Params returns the spec's parameters.
func (s QueueSpec) Params() Params {
	return Params{Delay: usToDuration(s.DelayUS), Jitter: usToDuration(s.JitterUS), Loss: s.Loss}
}

// usToDuration converts microseconds, mapping values too large for a
// Duration to one that Params.Validate rejects rather than wrapping.
func usToDuration(us int64) time.Duration {
	if us > int64(maxDelay/time.Microsecond) {
		return maxDelay + time.Microsecond
	}
	if us < 0 {
		return -time.Microsecond
	}
	return time.Duration(us) * time.Microsecond
}

// SpecOf returns the wire form of queue's parameters p.
func SpecOf(queue uint16, p Params) QueueSpec {
	return QueueSpec{Queue: queue, DelayUS: p.Delay.Microseconds(), JitterUS: p.Jitter.Microseconds(), Loss: p.Loss}
}

// ParseQueueSpec parses the command-line form of a queue spec,
// "N[:delay_us[:jitter_us[:loss]]]", e.g. "3:10000:2000:0.01".
func ParseQueueSpec(s string) (QueueSpec, error) {
	f := strings.Split(s, ":")
	if len(f) > 4 {
		return QueueSpec{}, fmt.Errorf("queue spec %q: want N[:delay_us[:jitter_us[:loss]]]", s)
	}
	var q QueueSpec
	n, err := strconv.ParseUint(f[0], 10, 16)
	if err != nil {
		return QueueSpec{}, fmt.Errorf("queue spec %q: queue number: %w", s, err)
	}
	q.Queue = uint16(n)
	for i, dst := range []*int64{&q.DelayUS, &q.JitterUS} {
		if len(f) > i+1 {
			if *dst, err = strconv.ParseInt(f[i+1], 10, 64); err != nil {
				return QueueSpec{}, fmt.Errorf("queue spec %q: %w", s, err)
			}
		}
	}
	if len(f) > 3 {
		if q.Loss, err = strconv.ParseFloat(f[3], 64); err != nil {
			return QueueSpec{}, fmt.Errorf("queue spec %q: loss: %w", s, err)
		}
	}
	if err := q.Params().Validate(); err != nil {
		return QueueSpec{}, fmt.Errorf("queue spec %q: %w", s, err)
	}
	return q, nil
}

type request struct {
	Op string `json:"op,omitempty"`
	QueueSpec
}

type response struct {
	OK     bool          `json:"ok"`
	Error  string        `json:"error,omitempty"`
	Queues []QueueStatus `json:"queues,omitempty"`
}

// ErrDaemon wraps an error reported by the daemon over the control socket.
var ErrDaemon = errors.New("link daemon")

// ctlTimeout bounds one control exchange on both sides.
const ctlTimeout = 5 * time.Second

// SetParams asks the daemon listening on sockPath to set one queue's
// parameters (binding the queue if it does not serve it yet).
func SetParams(ctx context.Context, sockPath string, queue uint16, p Params) error {
	if err := p.Validate(); err != nil {
		return err
	}
	_, err := call(ctx, sockPath, request{Op: "set", QueueSpec: SpecOf(queue, p)})
	if err != nil {
		return fmt.Errorf("set queue %d: %w", queue, err)
	}
	return nil
}

// Status asks the daemon listening on sockPath for its queues.
func Status(ctx context.Context, sockPath string) ([]QueueStatus, error) {
	r, err := call(ctx, sockPath, request{Op: "status"})
	if err != nil {
		return nil, fmt.Errorf("link daemon status: %w", err)
	}
	return r.Queues, nil
}

func call(ctx context.Context, sockPath string, req request) (response, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", sockPath)
	if err != nil {
		return response{}, err
	}
	defer c.Close()
	deadline := time.Now().Add(ctlTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	_ = c.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if err := json.NewEncoder(c).Encode(req); err != nil {
		return response{}, errors.Join(err, ctx.Err())
	}
	var r response
	if err := json.NewDecoder(bufio.NewReader(c)).Decode(&r); err != nil {
		return response{}, fmt.Errorf("read response: %w", errors.Join(err, ctx.Err()))
	}
	if !r.OK {
		return response{}, fmt.Errorf("%w: %s", ErrDaemon, r.Error)
	}
	return r, nil
}

// listenControl listens on path, replacing a stale socket left by a dead
// daemon (but no other kind of file).
func listenControl(path string) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("control path %s exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("control socket %s is in use by another daemon", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove stale control socket: %w", err)
		}
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on control socket: %w", err)
	}
	// Removing the file is done by shutdown, not by the listener.
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	return ln, nil
}

// serveControl accepts control connections until the listener closes.
func (d *Daemon) serveControl(ctx context.Context) {
	for {
		c, err := d.ln.Accept()
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
				d.log.Error("control socket accept", "err", err)
			}
			return
		}
		d.mu.Lock()
		if d.closing {
			d.mu.Unlock()
			c.Close()
			return
		}
		d.ctlConns[c] = struct{}{}
		d.ctlWG.Add(1)
		d.mu.Unlock()
		go func() {
			defer d.ctlWG.Done()
			d.handleControl(c)
			d.mu.Lock()
			delete(d.ctlConns, c)
			d.mu.Unlock()
			c.Close()
		}()
	}
}

func (d *Daemon) handleControl(c net.Conn) {
	_ = c.SetDeadline(time.Now().Add(ctlTimeout))
	var req request
	var resp response
	if err := json.NewDecoder(bufio.NewReader(c)).Decode(&req); err != nil {
		resp.Error = "bad request: " + err.Error()
	} else {
		switch req.Op {
		case "", "set":
			if err := d.SetParams(req.Queue, req.Params()); err != nil {
				resp.Error = err.Error()
			} else {
				resp.OK = true
			}
		case "status":
			resp.OK, resp.Queues = true, d.Status()
		default:
			resp.Error = fmt.Sprintf("unknown op %q (want set or status)", req.Op)
		}
	}
	if err := json.NewEncoder(c).Encode(resp); err != nil {
		d.log.Debug("control response not sent", "err", err)
	}
}
