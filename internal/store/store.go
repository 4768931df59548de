package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	_ "modernc.org/sqlite" // the "sqlite" driver
)

// Store is what the controller persists. Implementations are safe for
// concurrent use.
type Store interface {
	// Put stores the current record of kind/key (replacing it).
	Put(ctx context.Context, kind, key string, v any) error
	// Get decodes the record of kind/key into v; ErrNotFound when absent.
	Get(ctx context.Context, kind, key string, v any) error
	// List calls fn with every record of kind, ordered by key.
	List(ctx context.Context, kind string, fn func(key string, raw json.RawMessage) error) error
	// Delete removes a record; absent is not an error.
	Delete(ctx context.Context, kind, key string) error
	// Append adds an entry to the history of kind and returns its id.
	Append(ctx context.Context, kind string, at time.Time, v any) (int64, error)
	// History returns up to limit entries of kind, newest first, with
	// id below before (0: from the newest).
	History(ctx context.Context, kind string, before int64, limit int) ([]Entry, error)
	Close() error
}

// Entry is one history entry.
type Entry struct {
	ID   int64           `json:"id"`
	Kind string          `json:"kind"`
	At   time.Time       `json:"at"`
	Data json.RawMessage `json:"data"`
}

// ErrNotFound is returned by Get for an absent record.
var ErrNotFound = errors.New("no such record")

// SQLite is the SQLite implementation of Store.
type SQLite struct {
	db *sql.DB
}

var _ Store = (*SQLite)(nil)

const schema = `
CREATE TABLE IF NOT EXISTS records (
	kind TEXT NOT NULL,
	key TEXT NOT NULL,
	data TEXT NOT NULL,
	updated INTEGER NOT NULL,
	PRIMARY KEY (kind, key)
);
CREATE TABLE IF NOT EXISTS history (
	id INTEGER PRIMARY KEY AUTOINCREMENT,
	kind TEXT NOT NULL,
	at INTEGER NOT NULL,
	data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS history_kind ON history (kind, id);
`

// Open opens (creating) the database at path; ":memory:" for a private
// in-memory one.
func Open(path string) (*SQLite, error) {
	dsn := path
	if path != ":memory:" {
		dsn = "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_pragma=busy_timeout(5000)&_pragma=foreign_keys(1)"
	}
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("store %s: %w", path, err)
	}
	if path == ":memory:" {
		db.SetMaxOpenConns(1) // one connection, one database
	}
	if _, err := db.Exec(schema); err != nil {
		db.Close()
		return nil, fmt.Errorf("store %s: schema: %w", path, err)
	}
	return &SQLite{db: db}, nil
}

// Close closes the database.
func (s *SQLite) Close() error { return s.db.Close() }

// Put implements Store.
func (s *SQLite) Put(ctx context.Context, kind, key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("store %s/%s: %w", kind, key, err)
	}
	_, err = s.db.ExecContext(ctx, `INSERT INTO records (kind, key, data, updated) VALUES (?, ?, ?, ?)
		ON CONFLICT (kind, key) DO UPDATE SET data = excluded.data, updated = excluded.updated`, kind, key, string(b), time.Now().UnixNano())
	if err != nil {
		return fmt.Errorf("store %s/%s: %w", kind, key, err)
	}
	return nil
}

// Get implements Store.
func (s *SQLite) Get(ctx context.Context, kind, key string, v any) error {
	var data string
	err := s.db.QueryRowContext(ctx, `SELECT data FROM records WHERE kind = ? AND key = ?`, kind, key).Scan(&data)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("%w: %s/%s", ErrNotFound, kind, key)
	}
	if err != nil {
		return fmt.Errorf("store %s/%s: %w", kind, key, err)
	}
	if err := json.Unmarshal([]byte(data), v); err != nil {
		return fmt.Errorf("store %s/%s: %w", kind, key, err)
	}
	return nil
}

// List implements Store.
func (s *SQLite) List(ctx context.Context, kind string, fn func(string, json.RawMessage) error) error {
	rows, err := s.db.QueryContext(ctx, `SELECT key, data FROM records WHERE kind = ? ORDER BY key`, kind)
	if err != nil {
		return fmt.Errorf("store %s: %w", kind, err)
	}
	defer rows.Close()
	var recs [][2]string
	for rows.Next() {
		var k, d string
		if err := rows.Scan(&k, &d); err != nil {
			return fmt.Errorf("store %s: %w", kind, err)
		}
		recs = append(recs, [2]string{k, d})
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("store %s: %w", kind, err)
	}
	rows.Close()
	for _, r := range recs {
		if err := fn(r[0], json.RawMessage(r[1])); err != nil {
			return err
		}
	}
	return nil
}

// Delete implements Store.
func (s *SQLite) Delete(ctx context.Context, kind, key string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM records WHERE kind = ? AND key = ?`, kind, key); err != nil {
		return fmt.Errorf("store %s/%s: %w", kind, key, err)
	}
	return nil
}

// Append implements Store.
func (s *SQLite) Append(ctx context.Context, kind string, at time.Time, v any) (int64, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return 0, fmt.Errorf("store history %s: %w", kind, err)
	}
	res, err := s.db.ExecContext(ctx, `INSERT INTO history (kind, at, data) VALUES (?, ?, ?)`, kind, at.UnixNano(), string(b))
	if err != nil {
		return 0, fmt.Errorf("store history %s: %w", kind, err)
	}
	return res.LastInsertId()
}

// History implements Store.
func (s *SQLite) History(ctx context.Context, kind string, before int64, limit int) ([]Entry, error) {
	if limit <= 0 || limit > 10000 {
		limit = 10000
	}
	if before <= 0 {
		before = 1 << 62
	}
	rows, err := s.db.QueryContext(ctx, `SELECT id, at, data FROM history WHERE kind = ? AND id < ? ORDER BY id DESC LIMIT ?`, kind, before, limit)
	if err != nil {
		return nil, fmt.Errorf("store history %s: %w", kind, err)
	}
	defer rows.Close()
	var out []Entry
	for rows.Next() {
		var e Entry
		var at int64
		var d string
		if err := rows.Scan(&e.ID, &at, &d); err != nil {
			return nil, fmt.Errorf("store history %s: %w", kind, err)
		}
		e.Kind, e.At, e.Data = kind, time.Unix(0, at).UTC(), json.RawMessage(d)
		out = append(out, e)
	}
	return out, rows.Err()
}
