package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/api"
	"github.com/edgehop/edgehop/internal/radio"
	"github.com/edgehop/edgehop/internal/store"
	"github.com/edgehop/edgehop/internal/topo"
)

func mustJSON(tb testing.TB, v any) []byte {
	tb.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// FuzzHeartbeat: an agent's heartbeat body never panics the agent
// listener's decoding nor the controller that takes it; a refusal wraps
// ErrInvalid, and what decodes re-encodes to a body that decodes the
// same.
func FuzzHeartbeat(f *testing.F) {
	f.Add(mustJSON(f, api.Heartbeat{Node: "node1", Address: "172.30.0.2", LinkBps: 1e9, Containers: []string{"redis", "web"},
		Groups: []string{"shop"}, Migrating: []string{"db"}, MemoryBytes: map[string]int64{"redis": 5 << 20, "shop": 1 << 30},
		NeighbourRTTMs: map[string]float64{"node0": 1.5}, UserRTTMs: map[string]float64{"alice": 12.25}}))
	f.Add([]byte(`{"node":"node0","containers":[]}]`))
	f.Add([]byte(`{"node":"node0","unknown":1}`))
	st, err := store.Open(filepath.Join(f.TempDir(), "db"))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { st.Close() })
	c, err := New(context.Background(), Config{Topology: topo.Line(3, 2, 300), Radio: radio.DefaultModel(), Store: st, Access: &fakeAccess{}})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var hb api.Heartbeat
		if err := decodeBody(b, &hb); err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		re := mustJSON(t, hb)
		var again api.Heartbeat
		if err := decodeBody(re, &again); err != nil || !bytes.Equal(mustJSON(t, again), re) {
			t.Fatalf("re-encoded %s decodes to %+v (%v)", re, again, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = c.Heartbeat(ctx, hb) // an unknown node or bad figure is an error, never a panic
	})
}

// FuzzStoreRows: a row of the controller's store (a user, a service, a
// migration in flight) never panics its decoding, and what decodes
// re-encodes stably.
func FuzzStoreRows(f *testing.F) {
	now := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	f.Add(mustJSON(f, UserState{Name: "alice"}))
	f.Add(mustJSON(f, ServiceState{Name: "redis"}))
	f.Add(mustJSON(f, MigrationRecord{ID: "0123456789abcdef", Time: now, Service: "redis", From: "node0", To: "node1", Strategy: "pre-copy", OK: true, DowntimeMs: 80.5, PhasesMs: map[string]float64{"dump": 12}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, newRow := range []func() any{
			func() any { return new(UserState) },
			func() any { return new(ServiceState) },
			func() any { return new(MigrationRecord) },
		} {
			v := newRow()
			if json.Unmarshal(b, v) != nil {
				continue
			}
			re, err := json.Marshal(v)
			if err != nil {
				continue // a time past year 9999 decodes but does not encode
			}
			w := newRow()
			if err := json.Unmarshal(re, w); err != nil {
				t.Fatalf("%T: re-encoded %s does not decode: %v", v, re, err)
			}
			if re2 := mustJSON(t, w); !bytes.Equal(re, re2) {
				t.Fatalf("%T: %s re-encodes as %s", v, re, re2)
			}
		}
	})
}
