package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/edgehop/edgehop/internal/api"
	"github.com/edgehop/edgehop/internal/policy"
	"github.com/edgehop/edgehop/internal/store"
	"github.com/edgehop/edgehop/internal/topo"
)

// Client talks to a controller's operator API. Safe for concurrent use.
type Client struct {
	base, token string
	hc          *http.Client
}

// NewClient returns a client for the controller at base (http://host:port)
// that authenticates with token (see Auth).
func NewClient(base, token string) *Client {
	return &Client{base: base, token: token, hc: &http.Client{Timeout: 30 * time.Second}}
}

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
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
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("%w: controller at %s unreachable (%v); is the testbed up ('edgehop testbed status')?", api.ErrUnavailable, c.base, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 32<<20))
	if resp.StatusCode/100 != 2 {
		var e api.Error
		if json.Unmarshal(b, &e) != nil || e.Message == "" {
			e = api.Error{Code: "internal", Message: fmt.Sprintf("controller answered %s: %s", resp.Status, bytes.TrimSpace(b))}
		}
		return &e
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(b, out)
}

// Nodes lists the nodes.
func (c *Client) Nodes(ctx context.Context) ([]NodeState, error) {
	var v []NodeState
	return v, c.do(ctx, http.MethodGet, "/v1/nodes", nil, &v)
}

// Users lists the users.
func (c *Client) Users(ctx context.Context) ([]UserState, error) {
	var v []UserState
	return v, c.do(ctx, http.MethodGet, "/v1/users", nil, &v)
}

// Services lists the services.
func (c *Client) Services(ctx context.Context) ([]ServiceState, error) {
	var v []ServiceState
	return v, c.do(ctx, http.MethodGet, "/v1/services", nil, &v)
}

// Topology returns the topology.
func (c *Client) Topology(ctx context.Context) (topo.Topology, error) {
	var v topo.Topology
	return v, c.do(ctx, http.MethodGet, "/v1/topology", nil, &v)
}

// AddUser registers a user.
func (c *Client) AddUser(ctx context.Context, r AddUserRequest) (UserState, error) {
	var v UserState
	return v, c.do(ctx, http.MethodPost, "/v1/users", r, &v)
}

// AddService makes a service follow a user.
func (c *Client) AddService(ctx context.Context, r AddServiceRequest) (ServiceState, error) {
	var v ServiceState
	return v, c.do(ctx, http.MethodPost, "/v1/services", r, &v)
}

// Move reports a user's position.
func (c *Client) Move(ctx context.Context, user string, p topo.Point) (MoveResult, error) {
	var v MoveResult
	return v, c.do(ctx, http.MethodPost, "/v1/users/"+url.PathEscape(user)+"/position", PositionRequest{Pos: p}, &v)
}

// Report sends what a user's device measures.
func (c *Client) Report(ctx context.Context, user string, throughputOps, latencyMs float64) ([]policy.Decision, error) {
	var v []policy.Decision
	return v, c.do(ctx, http.MethodPost, "/v1/users/"+url.PathEscape(user)+"/report", ReportRequest{ThroughputOps: throughputOps, LatencyMs: latencyMs}, &v)
}

// History returns up to limit entries of kind (decisions, handoffs,
// migrations, events), newest first.
func (c *Client) History(ctx context.Context, kind string, limit int) ([]store.Entry, error) {
	var v []store.Entry
	return v, c.do(ctx, http.MethodGet, "/v1/"+kind+"?limit="+strconv.Itoa(limit), nil, &v)
}
