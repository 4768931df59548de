package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"
)

// RunRequest asks an agent to create and start a container.
type RunRequest struct {
	Name  string   `json:"name"`
	Image string   `json:"image"`
	IP    string   `json:"ip,omitempty"` // overlay address; allocated when empty
	Args  []string `json:"args,omitempty"`
	Env   []string `json:"env,omitempty"`
}

// Container describes a container on a node.
type Container struct {
	Name   string `json:"name"`
	Node   string `json:"node"`
	Image  string `json:"image"`
	IP     string `json:"ip"`
	MAC    string `json:"mac"`
	Status string `json:"status"` // running, stopped, created, migrating
	PID    int    `json:"pid,omitempty"`
	// MemoryBytes is the container's resident memory (what a migration
	// moves), from its memory cgroup.
	MemoryBytes int64     `json:"memory_bytes,omitempty"`
	Args        []string  `json:"args,omitempty"`
	Created     time.Time `json:"created"`
}

// Endpoint is where an overlay MAC lives; agents announce them to peers.
type Endpoint struct {
	Name string `json:"name"`
	IP   string `json:"ip"`
	MAC  string `json:"mac"`
	VTEP string `json:"vtep"`
	Node string `json:"node"`
}

// Info describes an agent.
type Info struct {
	Node    string `json:"node"`
	Role    string `json:"role"`
	VTEP    string `json:"vtep"`
	API     string `json:"api"`
	Version string `json:"version"`
}

// Error is the body of every non-2xx response.
type Error struct {
	Code    string `json:"code"` // not_found, conflict, invalid, unavailable, internal
	Message string `json:"error"`
}

func (e *Error) Error() string { return e.Message }

// Sentinel errors matched with errors.Is against an *Error's code.
var (
	ErrNotFound    = errors.New("not found")
	ErrConflict    = errors.New("conflict")
	ErrInvalid     = errors.New("invalid request")
	ErrUnavailable = errors.New("unavailable")
)

// Is maps codes to the sentinels.
func (e *Error) Is(target error) bool {
	switch e.Code {
	case "not_found":
		return target == ErrNotFound
	case "conflict":
		return target == ErrConflict
	case "invalid":
		return target == ErrInvalid
	case "unavailable":
		return target == ErrUnavailable
	}
	return false
}

// Client talks to one agent. Safe for concurrent use.
type Client struct {
	http *http.Client
	base string
	addr string // for error messages
}

// NewUnixClient returns a client for the agent's local socket.
func NewUnixClient(sock string) *Client {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}
	return &Client{http: &http.Client{Transport: tr}, base: "http://agent", addr: sock}
}

// NewTCPClient returns a client for an agent's peer API at host:port.
func NewTCPClient(addr string, hc *http.Client) *Client {
	if hc == nil {
		hc = &http.Client{}
	}
	scheme := "http"
	if t, ok := hc.Transport.(*http.Transport); ok && t.TLSClientConfig != nil {
		scheme = "https"
	}
	return &Client{http: hc, base: scheme + "://" + addr, addr: addr}
}

// Do sends a request with an optional JSON body and decodes a JSON answer
// into out (when non-nil).
func (c *Client) Do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil && ctx.Err() != nil {
		// Reached, but no answer in time: not an unreachable agent.
		return fmt.Errorf("%w: no answer from the agent at %s in time (%v)", ErrUnavailable, c.addr, ctx.Err())
	}
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("%w: agent at %s unreachable (%v); is the testbed up ('edgehop testbed status')?", ErrUnavailable, c.addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		var e Error
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if json.Unmarshal(b, &e) != nil || e.Message == "" {
			e = Error{Code: "internal", Message: fmt.Sprintf("agent answered %s: %s", resp.Status, bytes.TrimSpace(b))}
		}
		return &e
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if w, ok := out.(io.Writer); ok {
		_, err = io.Copy(w, resp.Body)
		return err
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// Info returns the agent's identity.
func (c *Client) Info(ctx context.Context) (Info, error) {
	var i Info
	return i, c.Do(ctx, http.MethodGet, "/v1/info", nil, &i)
}

// Run creates and starts a container.
func (c *Client) Run(ctx context.Context, r RunRequest) (Container, error) {
	var ct Container
	return ct, c.Do(ctx, http.MethodPost, "/v1/containers", r, &ct)
}

// List returns the agent's containers.
func (c *Client) List(ctx context.Context) ([]Container, error) {
	var cs []Container
	return cs, c.Do(ctx, http.MethodGet, "/v1/containers", nil, &cs)
}

// Get returns one container.
func (c *Client) Get(ctx context.Context, name string) (Container, error) {
	var ct Container
	return ct, c.Do(ctx, http.MethodGet, "/v1/containers/"+url.PathEscape(name), nil, &ct)
}

// Remove stops and deletes a container.
func (c *Client) Remove(ctx context.Context, name string) error {
	return c.Do(ctx, http.MethodDelete, "/v1/containers/"+url.PathEscape(name), nil, nil)
}

// Logs copies a container's output to w.
func (c *Client) Logs(ctx context.Context, name string, w io.Writer) error {
	return c.Do(ctx, http.MethodGet, "/v1/containers/"+url.PathEscape(name)+"/logs", nil, w)
}

// Endpoints lists the overlay endpoints an agent hosts.
func (c *Client) Endpoints(ctx context.Context) ([]Endpoint, error) {
	var es []Endpoint
	return es, c.Do(ctx, http.MethodGet, "/v1/endpoints", nil, &es)
}

// Announce tells a peer where an endpoint lives now.
func (c *Client) Announce(ctx context.Context, e Endpoint) error {
	return c.Do(ctx, http.MethodPut, "/v1/fdb", e, nil)
}

// Withdraw tells a peer an endpoint is gone.
func (c *Client) Withdraw(ctx context.Context, e Endpoint) error {
	return c.Do(ctx, http.MethodDelete, "/v1/fdb", e, nil)
}

// MigrateRequest asks a node's agent to move one of its containers.
type MigrateRequest struct {
	To       string `json:"to"`
	Strategy string `json:"strategy"`
	Rounds   int    `json:"rounds,omitempty"` // pre-copy: most live rounds; 0 = agent default
	// Compression is off, zstd or auto ("" = auto); LinkBps the path's
	// rate that auto weighs compression against.
	Compression string `json:"compression,omitempty"`
	LinkBps     int64  `json:"link_bps,omitempty"`
}

// Migrate asks the agent hosting name to move it; out receives the
// migration's result (also on a failed migration, whose error is returned
// beside it).
func (c *Client) Migrate(ctx context.Context, name string, r MigrateRequest, out any) error {
	return c.Do(ctx, http.MethodPost, "/v1/containers/"+url.PathEscape(name)+"/migrate", r, out)
}
