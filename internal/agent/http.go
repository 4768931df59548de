package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"os"
	"time"

	"github.com/edgehop/edgehop/internal/api"
	"github.com/edgehop/edgehop/internal/journal"
	"github.com/edgehop/edgehop/internal/migration"
	"github.com/edgehop/edgehop/internal/netplane"
	"github.com/edgehop/edgehop/internal/pki"
	"github.com/edgehop/edgehop/internal/runc"
)

// The agent serves two APIs, and never one on the other's listener:
//
//   - the operator API (operatorHandler): containers, migration jobs,
//     logs, metrics. On the unix socket (mode 0600, so root only) and,
//     with an operator certificate, over mutually authenticated TLS.
//   - the peer API (peerHandler): endpoints, FDB announcements, journal
//     phases. Only over mutually authenticated TLS, only for the
//     configured peers named by their certificates.
//
// Errors become {"error","code"} bodies here and only here.

// operatorHandler routes the operator API.
func (a *Agent) operatorHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/info", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, a.info())
	})
	mux.HandleFunc("GET /v1/containers", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, a.List(r.Context()))
	})
	mux.HandleFunc("POST /v1/containers", func(w http.ResponseWriter, r *http.Request) {
		var req api.RunRequest
		if err := decode(r, &req); err != nil {
			writeErr(w, err)
			return
		}
		c, err := a.Create(r.Context(), req)
		if err != nil {
			writeErr(w, err)
			return
		}
		writeJSON(w, http.StatusCreated, c)
	})
	mux.HandleFunc("GET /v1/containers/{name}", func(w http.ResponseWriter, r *http.Request) {
		c, err := a.Get(r.Context(), r.PathValue("name"))
		if err != nil {
			writeErr(w, err)
			return
		}
		writeJSON(w, http.StatusOK, c)
	})
	mux.HandleFunc("DELETE /v1/containers/{name}", func(w http.ResponseWriter, r *http.Request) {
		if err := a.Remove(r.Context(), r.PathValue("name")); err != nil {
			writeErr(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /v1/containers/{name}/logs", func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		if _, err := a.Get(r.Context(), name); err != nil {
			writeErr(w, err)
			return
		}
		f, err := os.Open(a.logPath(name))
		if err != nil {
			writeErr(w, err)
			return
		}
		defer f.Close()
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.Copy(w, f)
	})
	mux.HandleFunc("POST /v1/migrations", func(w http.ResponseWriter, r *http.Request) {
		var req api.StartMigration
		if err := decode(r, &req); err != nil {
			writeErr(w, err)
			return
		}
		mr, err := migrationRequest(req.MigrateRequest)
		if err != nil {
			writeErr(w, err)
			return
		}
		j, err := a.StartMigration(req.Container, mr)
		if err != nil {
			writeErr(w, err)
			return
		}
		snap, _, _ := j.snapshot(a.cfg.Node)
		writeJSON(w, http.StatusAccepted, snap)
	})
	mux.HandleFunc("POST /v1/groups/{group}/migrations", func(w http.ResponseWriter, r *http.Request) {
		var req api.MigrateRequest
		if err := decode(r, &req); err != nil {
			writeErr(w, err)
			return
		}
		mr, err := migrationRequest(req)
		if err != nil {
			writeErr(w, err)
			return
		}
		js, err := a.StartGroupMigration(r.PathValue("group"), mr)
		if err != nil {
			writeErr(w, err)
			return
		}
		out := make([]api.Job, 0, len(js))
		for _, j := range js {
			snap, _, _ := j.snapshot(a.cfg.Node)
			out = append(out, snap)
		}
		writeJSON(w, http.StatusAccepted, out)
	})
	mux.HandleFunc("GET /v1/migrations", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, a.Jobs())
	})
	mux.HandleFunc("GET /v1/migrations/{id}", func(w http.ResponseWriter, r *http.Request) {
		j, err := a.Job(r.PathValue("id"))
		if err != nil {
			writeErr(w, err)
			return
		}
		writeJSON(w, http.StatusOK, j)
	})
	mux.HandleFunc("GET /v1/migrations/{id}/events", func(w http.ResponseWriter, r *http.Request) {
		a.streamJob(w, r, r.PathValue("id"))
	})
	mux.HandleFunc("DELETE /v1/migrations/{id}", func(w http.ResponseWriter, r *http.Request) {
		j := a.jobs.get(r.PathValue("id"))
		if j == nil {
			writeErr(w, fmt.Errorf("%w: no running migration %q on %s", ErrNotFound, r.PathValue("id"), a.cfg.Node))
			return
		}
		if j.role != migration.RoleSource {
			writeErr(w, fmt.Errorf("%w: migration %s is cancelled on its source, %s", ErrConflict, j.id, j.from))
			return
		}
		if err := j.requestCancel(); err != nil {
			writeErr(w, err)
			return
		}
		w.WriteHeader(http.StatusAccepted)
	})
	mux.HandleFunc("GET /v1/endpoints", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, a.Endpoints())
	})
	// An operator may place endpoints of workloads it runs itself (the
	// podman baseline of 'bench continuity' does).
	opCheck := func(_ *http.Request, e api.Endpoint) error { return a.checkOperatorEndpoint(e) }
	mux.HandleFunc("PUT /v1/fdb", fdbHandler(opCheck, a.learn))
	mux.HandleFunc("DELETE /v1/fdb", fdbHandler(opCheck, a.forget))
	mux.Handle("GET /metrics", a.metrics.Handler())
	// Go's profiles of the agent itself (CPU, heap, goroutines, blocking),
	// for operators only: `edgehop profile --node N`.
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	return mux
}

// peerHandler routes the peer API. Every request comes over mutually
// authenticated TLS from a configured peer (peerOnly).
func (a *Agent) peerHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/info", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, a.info())
	})
	mux.HandleFunc("GET /v1/endpoints", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, a.Endpoints())
	})
	peerCheck := func(r *http.Request, e api.Endpoint) error { return a.checkAnnouncement(peerOf(r.Context()), e) }
	mux.HandleFunc("PUT /v1/fdb", fdbHandler(peerCheck, a.learn))
	mux.HandleFunc("DELETE /v1/fdb", fdbHandler(peerCheck, a.forget))
	mux.HandleFunc("GET /v1/peer/migrations/{id}", func(w http.ResponseWriter, r *http.Request) {
		rec, err := a.journal.Get(r.PathValue("id"))
		if errors.Is(err, journal.ErrNotFound) {
			writeErr(w, fmt.Errorf("%w: %v", ErrNotFound, err))
			return
		}
		if err != nil {
			// Unreadable (EIO, EMFILE, a damaged record): the peer must
			// not read it as "gave up" and destroy its copy. It asks again.
			writeErr(w, fmt.Errorf("migration %s: journal unreadable: %w", r.PathValue("id"), err))
			return
		}
		// Only the other side of the migration may ask.
		if rec.Peer != peerOf(r.Context()).Name {
			writeErr(w, fmt.Errorf("%w: migration %s is not %s's", ErrForbidden, rec.ID, peerOf(r.Context()).Name))
			return
		}
		ph := api.PeerPhase{ID: rec.ID, Role: string(rec.Role), Phase: string(rec.Phase)}
		if rec.Role == migration.RoleDestination {
			st, err := a.rt.State(r.Context(), rec.Container)
			ph.Running = err == nil && st.Status == runc.StatusRunning
		} else {
			ph.Holds = a.holdsTasks(r.Context(), rec.Container)
		}
		writeJSON(w, http.StatusOK, ph)
	})
	return a.peerOnly(mux)
}

// operatorOnly admits requests over TLS whose verified client certificate
// is an operator's (the listener's handshake already insists; this keeps
// the handler safe on any listener).
func operatorOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil {
			writeErr(w, fmt.Errorf("%w: the operator API over TCP needs an operator certificate", ErrForbidden))
			return
		}
		if _, err := pki.OperatorName(*r.TLS); err != nil {
			writeErr(w, fmt.Errorf("%w: %v", ErrForbidden, err))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// fdbHandler decodes an endpoint, checks it and applies it to the FDB.
func fdbHandler(check func(*http.Request, api.Endpoint) error, apply func(api.Endpoint) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var e api.Endpoint
		if err := decode(r, &e); err != nil {
			writeErr(w, err)
			return
		}
		if err := check(r, e); err != nil {
			writeErr(w, err)
			return
		}
		if err := apply(e); err != nil {
			writeErr(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}
}

type peerKey struct{}

func peerOf(ctx context.Context) Peer {
	p, _ := ctx.Value(peerKey{}).(Peer)
	return p
}

// peerOnly admits requests whose verified client certificate names a
// configured peer.
func (a *Agent) peerOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil {
			writeErr(w, fmt.Errorf("%w: the peer API needs mutually authenticated TLS", ErrForbidden))
			return
		}
		name, err := pki.PeerName(*r.TLS)
		if err != nil {
			writeErr(w, fmt.Errorf("%w: %v", ErrForbidden, err))
			return
		}
		for _, p := range a.cfg.Peers {
			if p.Name == name {
				next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), peerKey{}, p)))
				return
			}
		}
		writeErr(w, fmt.Errorf("%w: %q is not a configured peer of %s", ErrForbidden, name, a.cfg.Node))
	})
}

// checkAnnouncement accepts an endpoint announcement or withdrawal only
// from the node it names, for that node's own VTEP, with a MAC that is the
// one derived from an overlay address.
func (a *Agent) checkAnnouncement(from Peer, e api.Endpoint) error {
	if from.Migrate == "" {
		return fmt.Errorf("%w: %s runs no containers and announces none", ErrForbidden, from.Name)
	}
	if e.Node != from.Name {
		return fmt.Errorf("%w: %s announced an endpoint of node %q", ErrForbidden, from.Name, e.Node)
	}
	if e.VTEP != from.VTEP.String() {
		return fmt.Errorf("%w: %s announced VTEP %q, its own is %s", ErrForbidden, from.Name, e.VTEP, from.VTEP)
	}
	return a.checkEndpoint(e)
}

// checkOperatorEndpoint accepts an endpoint an operator places by hand
// (a workload edgehop does not run, wired into the overlay): it must live
// at this node's VTEP or a configured peer's.
func (a *Agent) checkOperatorEndpoint(e api.Endpoint) error {
	known := e.VTEP == a.cfg.VTEP.String()
	for _, p := range a.cfg.Peers {
		known = known || (p.Migrate != "" && e.VTEP == p.VTEP.String())
	}
	if !known {
		return fmt.Errorf("%w: endpoint VTEP %q is neither %s's nor a peer node's", ErrInvalid, e.VTEP, a.cfg.Node)
	}
	return a.checkEndpoint(e)
}

// checkEndpoint checks an endpoint's name, that its address is a
// service address of the overlay and that its MAC is the one derived
// from that address.
func (a *Agent) checkEndpoint(e api.Endpoint) error {
	if !containerNameRE.MatchString(e.Name) {
		return fmt.Errorf("%w: endpoint name %q", ErrInvalid, e.Name)
	}
	ip, err := netip.ParseAddr(e.IP)
	if err != nil || !a.cfg.Overlay.Contains(ip) || ip == a.cfg.Gateway {
		return fmt.Errorf("%w: endpoint address %q is not a service address of the overlay %v", ErrInvalid, e.IP, a.cfg.Overlay)
	}
	if want := netplane.MACFor(ip).String(); e.MAC != want {
		return fmt.Errorf("%w: endpoint MAC %q is not %s's (%s)", ErrInvalid, e.MAC, e.IP, want)
	}
	return nil
}

// Jobs lists this node's migration jobs: those it remembers, then the
// older ones of its history.
func (a *Agent) Jobs() []api.Job {
	seen := map[string]bool{}
	var out []api.Job
	for _, j := range a.jobs.all() {
		s, _, _ := j.snapshot(a.cfg.Node)
		seen[s.ID] = true
		out = append(out, s)
	}
	var hist []api.Job
	_ = a.history(func(r migration.Result) bool {
		if r.ID != "" && !seen[r.ID] {
			hist = append(hist, jobOfResult(a.cfg.Node, r))
			seen[r.ID] = true
		}
		return true
	})
	return append(hist, out...)
}

// Job describes one migration job, running or from the history.
func (a *Agent) Job(id string) (api.Job, error) {
	if j := a.jobs.get(id); j != nil {
		s, _, _ := j.snapshot(a.cfg.Node)
		return s, nil
	}
	var found *api.Job
	_ = a.history(func(r migration.Result) bool {
		if r.ID == id {
			j := jobOfResult(a.cfg.Node, r)
			found = &j
			return false
		}
		return true
	})
	if found != nil {
		return *found, nil
	}
	if rec, err := a.journal.Get(id); err == nil && !rec.Phase.Final() {
		// Journaled but not yet settled (an agent that restarted is
		// settling it).
		return api.Job{ID: id, Role: string(rec.Role), Container: rec.Container, Strategy: string(rec.Strategy),
			Node: a.cfg.Node, State: "running", Started: rec.Started, Progress: &api.Progress{Time: rec.Updated, Phase: string(rec.Phase)}}, nil
	}
	return api.Job{}, fmt.Errorf("%w: no migration %q on %s", ErrNotFound, id, a.cfg.Node)
}

func jobOfResult(node string, r migration.Result) api.Job {
	state := string(r.Outcome)
	if state == "" { // recorded before outcomes were
		state = "failed"
		if r.OK {
			state = string(migration.OutcomeOK)
		} else if r.RolledBack {
			state = string(migration.OutcomeRolledBack)
		}
	}
	b, _ := json.Marshal(r)
	return api.Job{ID: r.ID, Role: string(migration.RoleSource), Container: r.Container, From: r.From, To: r.To,
		Strategy: string(r.Strategy), Node: node, State: state, Started: r.Started, Result: b}
}

// streamJob writes a job's progress as NDJSON until it ends, then the job.
func (a *Agent) streamJob(w http.ResponseWriter, r *http.Request, id string) {
	j := a.jobs.get(id)
	if j == nil {
		done, err := a.Job(id)
		if err != nil {
			writeErr(w, err)
			return
		}
		if done.State == "running" {
			// Journaled, being settled after a restart: no live job to
			// follow here; the client asks again.
			writeErr(w, fmt.Errorf("%w: migration %s is being settled after a restart", ErrUnavailable, id))
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		_ = json.NewEncoder(w).Encode(api.JobEvent{Done: &done})
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	enc := json.NewEncoder(w)
	var last api.Progress
	for {
		snap, ended, changed := j.snapshot(a.cfg.Node)
		if snap.Progress != nil && *snap.Progress != last {
			last = *snap.Progress
			if err := enc.Encode(api.JobEvent{Progress: snap.Progress}); err != nil {
				return
			}
		}
		if ended {
			_ = enc.Encode(api.JobEvent{Done: &snap})
			return
		}
		if fl != nil {
			fl.Flush()
		}
		select {
		case <-r.Context().Done():
			return
		case <-changed:
			// At most ten progress lines a second.
			select {
			case <-time.After(100 * time.Millisecond):
			case <-r.Context().Done():
				return
			}
		}
	}
}

// maxRequestBytes bounds a request body.
const maxRequestBytes = 1 << 20

func decode(r *http.Request, v any) error {
	b, err := io.ReadAll(io.LimitReader(r.Body, maxRequestBytes+1))
	if err != nil {
		return fmt.Errorf("%w: request body: %v", ErrInvalid, err)
	}
	return decodeStrict(b, v)
}

// decodeStrict decodes exactly one JSON value of at most maxRequestBytes
// with no unknown fields.
func decodeStrict(b []byte, v any) error {
	if len(b) > maxRequestBytes {
		return fmt.Errorf("%w: request body larger than %d bytes", ErrInvalid, maxRequestBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: request body: %v", ErrInvalid, err)
	}
	if dec.More() {
		return fmt.Errorf("%w: request body: data after the JSON value", ErrInvalid)
	}
	return nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, err error) {
	status, code := http.StatusInternalServerError, "internal"
	switch {
	case errors.Is(err, ErrNotFound), errors.Is(err, journal.ErrNotFound):
		status, code = http.StatusNotFound, "not_found"
	case errors.Is(err, ErrConflict):
		status, code = http.StatusConflict, "conflict"
	case errors.Is(err, ErrInvalid):
		status, code = http.StatusBadRequest, "invalid"
	case errors.Is(err, ErrForbidden):
		status, code = http.StatusForbidden, "forbidden"
	case errors.Is(err, ErrUnavailable):
		status, code = http.StatusServiceUnavailable, "unavailable"
	}
	writeJSON(w, status, api.Error{Code: code, Message: err.Error()})
}

// migrationRequest reads an operator's migration request.
func migrationRequest(r api.MigrateRequest) (migration.Request, error) {
	s, err := migration.ParseStrategy(r.Strategy)
	if err != nil {
		return migration.Request{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return migration.Request{To: r.To, Strategy: s, Rounds: r.Rounds, Compression: r.Compression, LinkBps: r.LinkBps, MaxFrozenMs: r.MaxFrozenMs}, nil
}
