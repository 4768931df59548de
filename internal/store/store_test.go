package store

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"testing"
	"time"
)

type rec struct {
	Name string `json:"name"`
	N    int    `json:"n"`
}

// The conformance suite every Store implementation passes.
func testStore(t *testing.T, s Store, reopen func() Store) {
	ctx := context.Background()
	if err := s.Put(ctx, "users", "bob", rec{"bob", 1}); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, "users", "alice", rec{"alice", 2}); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, "users", "bob", rec{"bob", 3}); err != nil {
		t.Fatal(err)
	}
	var r rec
	if err := s.Get(ctx, "users", "bob", &r); err != nil || r.N != 3 {
		t.Fatalf("Get bob = %+v, %v", r, err)
	}
	if err := s.Get(ctx, "users", "carol", &r); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get carol err = %v", err)
	}
	var keys []string
	if err := s.List(ctx, "users", func(k string, raw json.RawMessage) error { keys = append(keys, k); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 || keys[0] != "alice" {
		t.Errorf("List = %v", keys)
	}
	for i := 0; i < 5; i++ {
		if _, err := s.Append(ctx, "decisions", time.Unix(int64(i), 0), rec{"d", i}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Append(ctx, "events", time.Now(), rec{"e", 0}); err != nil {
		t.Fatal(err)
	}
	h, err := s.History(ctx, "decisions", 0, 3)
	if err != nil || len(h) != 3 {
		t.Fatalf("History = %v, %v", h, err)
	}
	if err := json.Unmarshal(h[0].Data, &r); err != nil || r.N != 4 {
		t.Errorf("newest first: %s", h[0].Data)
	}
	older, _ := s.History(ctx, "decisions", h[2].ID, 10)
	if len(older) != 2 {
		t.Errorf("paging: %d older entries, want 2", len(older))
	}
	if err := s.Delete(ctx, "users", "bob"); err != nil {
		t.Fatal(err)
	}
	if reopen != nil {
		s = reopen()
		if err := s.Get(ctx, "users", "alice", &r); err != nil || r.N != 2 {
			t.Errorf("after reopening: %+v, %v", r, err)
		}
		if err := s.Get(ctx, "users", "bob", &r); !errors.Is(err, ErrNotFound) {
			t.Errorf("deleted record back after reopening: %v", err)
		}
		if h, _ := s.History(ctx, "decisions", 0, 0); len(h) != 5 {
			t.Errorf("history after reopening: %d entries", len(h))
		}
	}
}

func TestSQLite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "controller.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	var reopened *SQLite
	testStore(t, s, func() Store {
		s.Close()
		r, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		reopened = r
		return r
	})
	reopened.Close()
}

func TestSQLiteMemory(t *testing.T) {
	s, err := Open(":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	testStore(t, s, nil)
}
