package controller

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"strconv"
	"time"

	"github.com/edgehop/edgehop/internal/api"
	"github.com/edgehop/edgehop/internal/pki"
	"github.com/edgehop/edgehop/internal/policy"
	"github.com/edgehop/edgehop/internal/store"
	"github.com/edgehop/edgehop/internal/topo"
)

//go:embed web
var web embed.FS

// route is one route of the operator API, also its OpenAPI entry.
type route struct {
	method, path, summary string
	request, response     any // example values: their JSON field names document the schema
	handler               http.HandlerFunc
}

// Requests of the API.
type (
	// AddUserRequest registers a user.
	AddUserRequest struct {
		Name    string     `json:"name"`
		Address string     `json:"address,omitempty"`
		Pos     topo.Point `json:"pos"`
	}
	// PositionRequest is a user's new position.
	PositionRequest struct {
		Pos topo.Point `json:"pos"`
	}
	// ReportRequest is what a user's device reports.
	ReportRequest struct {
		ThroughputOps float64 `json:"throughput_ops"`
		LatencyMs     float64 `json:"latency_ms"`
	}
	// AddServiceRequest registers a service following a user.
	AddServiceRequest struct {
		Name        string        `json:"name"`
		User        string        `json:"user"`
		Node        string        `json:"node"`
		MemoryBytes int64         `json:"memory_bytes,omitempty"`
		DirtyRate   float64       `json:"dirty_rate,omitempty"`
		Policy      policy.Config `json:"policy"`
	}
)

func (c *Controller) routes() []route {
	return []route{
		{"GET", "/v1/topology", "the regions, access points, nodes and links", nil, topo.Topology{}, func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusOK, c.eng.Topology())
		}},
		{"GET", "/v1/nodes", "the edge nodes: liveness, containers, measured neighbour RTTs", nil, []NodeState{}, func(w http.ResponseWriter, r *http.Request) {
			n, _, _ := c.eng.Snapshot()
			writeJSON(w, http.StatusOK, nonNil(n))
		}},
		{"GET", "/v1/users", "the users: position, access point, measured RTTs", nil, []UserState{}, func(w http.ResponseWriter, r *http.Request) {
			_, u, _ := c.eng.Snapshot()
			writeJSON(w, http.StatusOK, nonNil(u))
		}},
		{"POST", "/v1/users", "register a user (attached to the strongest access point)", AddUserRequest{}, UserState{}, func(w http.ResponseWriter, r *http.Request) {
			var req AddUserRequest
			if !decode(w, r, &req) {
				return
			}
			u, err := c.AddUser(r.Context(), req.Name, req.Address, req.Pos)
			reply(w, http.StatusCreated, u, err)
		}},
		{"GET", "/v1/users/{name}", "one user", nil, UserState{}, func(w http.ResponseWriter, r *http.Request) {
			u, ok := c.eng.User(r.PathValue("name"))
			if !ok {
				writeErr(w, fmt.Errorf("%w: no user %q", ErrNotFound, r.PathValue("name")))
				return
			}
			writeJSON(w, http.StatusOK, u)
		}},
		{"POST", "/v1/users/{name}/position", "move a user: tier-1 handoff, then its services' policies", PositionRequest{}, MoveResult{}, func(w http.ResponseWriter, r *http.Request) {
			var req PositionRequest
			if !decode(w, r, &req) {
				return
			}
			res, err := c.Move(r.Context(), r.PathValue("name"), req.Pos)
			reply(w, http.StatusOK, res, err)
		}},
		{"POST", "/v1/users/{name}/report", "what the user's device measures of its service", ReportRequest{}, []policy.Decision{}, func(w http.ResponseWriter, r *http.Request) {
			var req ReportRequest
			if !decode(w, r, &req) {
				return
			}
			ds, err := c.Report(r.Context(), r.PathValue("name"), req.ThroughputOps, req.LatencyMs)
			reply(w, http.StatusOK, nonNil(ds), err)
		}},
		{"GET", "/v1/services", "the services and where they run", nil, []ServiceState{}, func(w http.ResponseWriter, r *http.Request) {
			_, _, s := c.eng.Snapshot()
			writeJSON(w, http.StatusOK, nonNil(s))
		}},
		{"POST", "/v1/services", "make a running service follow a user under a policy", AddServiceRequest{}, ServiceState{}, func(w http.ResponseWriter, r *http.Request) {
			var req AddServiceRequest
			if !decode(w, r, &req) {
				return
			}
			s, err := c.AddService(r.Context(), ServiceState{Name: req.Name, User: req.User, Node: req.Node, MemoryBytes: req.MemoryBytes, DirtyRate: req.DirtyRate, Policy: req.Policy})
			reply(w, http.StatusCreated, s, err)
		}},
		{"GET", "/v1/services/{name}", "one service", nil, ServiceState{}, func(w http.ResponseWriter, r *http.Request) {
			s, ok := c.eng.Service(r.PathValue("name"))
			if !ok {
				writeErr(w, fmt.Errorf("%w: no service %q", ErrNotFound, r.PathValue("name")))
				return
			}
			writeJSON(w, http.StatusOK, s)
		}},
		{"GET", "/v1/decisions", "policy decisions with their inputs and reasons, newest first (?limit=&before=)", nil, []store.Entry{}, c.history(KindDecisions)},
		{"GET", "/v1/handoffs", "tier-1 handoffs, newest first", nil, []store.Entry{}, c.history(KindHandoffs)},
		{"GET", "/v1/migrations", "migrations the controller started, with their phases, newest first", nil, []store.Entry{}, c.history(KindMigrations)},
		{"GET", "/v1/events", "node, user and service events, newest first", nil, []store.Entry{}, c.history(KindEvents)},
		{"GET", "/v1/stream", "server-sent events: every new history entry and migration progress", nil, StreamEvent{}, c.stream},
	}
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// history serves a store history kind.
func (c *Controller) history(kind string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		limit, before := 100, int64(0)
		if v := r.URL.Query().Get("limit"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 10000 {
				writeErr(w, fmt.Errorf("%w: limit %q: want 1..10000", ErrInvalid, v))
				return
			}
			limit = n
		}
		if v := r.URL.Query().Get("before"); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				writeErr(w, fmt.Errorf("%w: before %q", ErrInvalid, v))
				return
			}
			before = n
		}
		es, err := c.store.History(r.Context(), kind, before, limit)
		reply(w, http.StatusOK, nonNil(es), err)
	}
}

// stream sends every new entry as a server-sent event until the client
// goes.
func (c *Controller) stream(w http.ResponseWriter, r *http.Request) {
	fl, ok := w.(http.Flusher)
	if !ok {
		writeErr(w, errors.New("streaming unsupported"))
		return
	}
	ch, stop := c.events.subscribe()
	defer stop()
	// The server's read and write timeouts are for requests that end: a
	// stream has no read deadline (a client gone shows as a failed write
	// or a closed connection) and a write deadline a ping ahead.
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Time{})
	extend := func() { _ = rc.SetWriteDeadline(time.Now().Add(2 * streamPing)) }
	extend()
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	fl.Flush()
	ping := time.NewTicker(streamPing)
	defer ping.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case msg := <-ch:
			extend()
			if _, err := fmt.Fprintf(w, "data: %s\n\n", msg); err != nil {
				return
			}
			fl.Flush()
		case <-ping.C:
			extend()
			if _, err := io.WriteString(w, ": ping\n\n"); err != nil {
				return
			}
			fl.Flush()
		}
	}
}

// streamPing is how often an idle event stream sends a comment line.
var streamPing = 15 * time.Second

// Handler is the operator API, the dashboard and /openapi.json, every
// request checked by a (see Auth), and GET /login, which sets the
// dashboard's cookie.
func (c *Controller) Handler(a Auth) http.Handler {
	mux := http.NewServeMux()
	routes := c.routes()
	for _, rt := range routes {
		mux.HandleFunc(rt.method+" "+rt.path, rt.handler)
	}
	doc := openAPI(routes)
	mux.HandleFunc("GET /openapi.json", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, doc) })
	mux.Handle("GET /", http.FileServerFS(mustSub(web, "web")))
	return a.wrap(mux)
}

// AgentHandler serves the agents' heartbeats; every request must carry a
// verified certificate of the node it reports for.
func (c *Controller) AgentHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/agents/heartbeat", func(w http.ResponseWriter, r *http.Request) {
		var hb api.Heartbeat
		if !decode(w, r, &hb) {
			return
		}
		if r.TLS == nil {
			writeErr(w, fmt.Errorf("%w: heartbeats need mutually authenticated TLS", errForbidden))
			return
		}
		name, err := pki.PeerName(*r.TLS)
		if err != nil || name != hb.Node {
			writeErr(w, fmt.Errorf("%w: certificate %q reports for node %q", errForbidden, name, hb.Node))
			return
		}
		rep, err := c.Heartbeat(r.Context(), hb)
		reply(w, http.StatusOK, rep, err)
	})
	return mux
}

var errForbidden = errors.New("forbidden")

const maxBody = 1 << 20

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	b, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err == nil {
		err = decodeBody(b, v)
	} else {
		err = fmt.Errorf("%w: request body: %v", ErrInvalid, err)
	}
	if err != nil {
		writeErr(w, err)
		return false
	}
	return true
}

// decodeBody decodes a request body (an operator's request, an agent's
// heartbeat) strictly: at most maxBody bytes, one JSON value with no
// field v lacks and nothing after it but whitespace; its errors wrap
// ErrInvalid.
func decodeBody(b []byte, v any) error {
	if len(b) > maxBody {
		return fmt.Errorf("%w: request body larger than %d bytes", ErrInvalid, maxBody)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: request body: %v", ErrInvalid, err)
	}
	// Token, not More: More is false before a stray ']' or '}'.
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("%w: request body: data after the JSON value", ErrInvalid)
	}
	return nil
}

func reply(w http.ResponseWriter, status int, v any, err error) {
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, status, v)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, err error) {
	status, code := http.StatusInternalServerError, "internal"
	switch {
	case errors.Is(err, ErrNotFound), errors.Is(err, store.ErrNotFound):
		status, code = http.StatusNotFound, "not_found"
	case errors.Is(err, ErrInvalid):
		status, code = http.StatusBadRequest, "invalid"
	case errors.Is(err, errForbidden):
		status, code = http.StatusForbidden, "forbidden"
	case errors.Is(err, errUnauthenticated):
		status, code = http.StatusUnauthorized, "unauthenticated"
	case errors.Is(err, errMisdirected):
		status, code = http.StatusMisdirectedRequest, "misdirected"
	case errors.Is(err, errMediaType):
		status, code = http.StatusUnsupportedMediaType, "unsupported_media_type"
	}
	writeJSON(w, status, api.Error{Code: code, Message: err.Error()})
}

func mustSub(f embed.FS, dir string) fs.FS {
	sub, err := fs.Sub(f, dir)
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	return sub
}
