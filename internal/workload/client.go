package workload

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"time"
)

// Client asks a DPRGen over one connection. It is not safe for concurrent
// use; Close closes the connection.
type Client struct {
	conn net.Conn
	r    *bufio.Reader
}

// NewClient returns a client speaking over conn.
func NewClient(conn net.Conn) *Client {
	return &Client{conn: conn, r: bufio.NewReader(conn)}
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// LocalAddr is the client's end of the connection.
func (c *Client) LocalAddr() net.Addr { return c.conn.LocalAddr() }

// defaultTimeout bounds a request whose ctx has no deadline: a check of a
// large state takes about a second, so this only catches a dead peer.
const defaultTimeout = 2 * time.Minute

// roundTrip sends one request line and reads one reply line.
func (c *Client) roundTrip(ctx context.Context, req string) (string, error) {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(defaultTimeout)
	}
	if err := c.conn.SetDeadline(deadline); err != nil {
		return "", err
	}
	stop := context.AfterFunc(ctx, func() { c.conn.SetDeadline(time.Now()) })
	defer stop()
	if _, err := fmt.Fprintf(c.conn, "%s\n", req); err != nil {
		return "", fmt.Errorf("send %s: %w", req, err)
	}
	line, err := c.r.ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("read %s reply: %w", req, err)
	}
	return line, nil
}

// Check asks DPRGen to verify its whole state.
func (c *Client) Check(ctx context.Context) (CheckReply, error) {
	line, err := c.roundTrip(ctx, "check")
	if err != nil {
		return CheckReply{}, err
	}
	return ParseCheckReply(line)
}

// Stats asks DPRGen for its counters.
func (c *Client) Stats(ctx context.Context) (Stats, error) {
	line, err := c.roundTrip(ctx, "stats")
	if err != nil {
		return Stats{}, err
	}
	return ParseStats(line)
}
