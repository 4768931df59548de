package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"

	"github.com/edgehop/edgehop/internal/migration"

	"github.com/edgehop/edgehop/internal/api"
)

// handler routes the agent API. Errors become {"error","code"} bodies here
// and only here.
func (a *Agent) handler() http.Handler {
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
	mux.HandleFunc("POST /v1/containers/{name}/migrate", func(w http.ResponseWriter, r *http.Request) {
		var req migration.Request
		if err := decode(r, &req); err != nil {
			writeErr(w, err)
			return
		}
		s, err := migration.ParseStrategy(string(req.Strategy))
		if err != nil {
			writeErr(w, fmt.Errorf("%w: %v", ErrInvalid, err))
			return
		}
		req.Strategy = s
		res, err := a.Migrate(r.Context(), r.PathValue("name"), req)
		if err != nil && res.Started.IsZero() {
			writeErr(w, err)
			return
		}
		// A migration that started reports its outcome (also a failure,
		// with the reason and whether the service was rolled back) as a
		// result; only requests refused before starting are HTTP errors.
		if err != nil && res.Error == "" {
			res.Error = err.Error()
		}
		writeJSON(w, http.StatusOK, res)
	})
	mux.HandleFunc("GET /v1/migrations", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		f, err := os.Open(filepath.Join(a.cfg.StateDir, "migrations.jsonl"))
		if err != nil {
			return
		}
		defer f.Close()
		_, _ = io.Copy(w, f)
	})
	mux.HandleFunc("GET /v1/endpoints", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, a.Endpoints())
	})
	mux.HandleFunc("PUT /v1/fdb", func(w http.ResponseWriter, r *http.Request) {
		var e api.Endpoint
		if err := decode(r, &e); err != nil {
			writeErr(w, err)
			return
		}
		if err := a.learn(e); err != nil {
			writeErr(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("DELETE /v1/fdb", func(w http.ResponseWriter, r *http.Request) {
		var e api.Endpoint
		if err := decode(r, &e); err != nil {
			writeErr(w, err)
			return
		}
		if err := a.forget(e); err != nil {
			writeErr(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: request body: %v", ErrInvalid, err)
	}
	return nil
}

func writeErr(w http.ResponseWriter, err error) {
	status, code := http.StatusInternalServerError, "internal"
	switch {
	case errors.Is(err, ErrNotFound):
		status, code = http.StatusNotFound, "not_found"
	case errors.Is(err, ErrConflict):
		status, code = http.StatusConflict, "conflict"
	case errors.Is(err, ErrInvalid):
		status, code = http.StatusBadRequest, "invalid"
	}
	writeJSON(w, status, api.Error{Code: code, Message: err.Error()})
}
