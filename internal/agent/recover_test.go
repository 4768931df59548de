package agent

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/edgehop/edgehop/internal/journal"
	"github.com/edgehop/edgehop/internal/metrics"
	"github.com/edgehop/edgehop/internal/migration"
)

// TestSweepScratch: an agent that starts removes what migrations that
// ended left in its scratch directory, and keeps what the migrations it
// settles need.
func TestSweepScratch(t *testing.T) {
	a := &Agent{cfg: Config{StateDir: t.TempDir()}, log: slog.New(slog.DiscardHandler)}
	for _, d := range []string{"redis-in", "redis-in-work", ".redis-in.partial-123", "web-out", "web-out-work", ".web-in.partial-9", "db-store", "webshop-in"} {
		if err := os.MkdirAll(filepath.Join(a.scratchDir(), d, "sub"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	a.sweepScratch(map[string]bool{"web": true})
	ents, err := os.ReadDir(a.scratchDir())
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, e := range ents {
		left = append(left, e.Name())
	}
	if want := []string{".web-in.partial-9", "web-out", "web-out-work"}; !slices.Equal(left, want) {
		t.Errorf("left %v, want %v", left, want)
	}
}

// TestPendingRecoveriesKeepsCommittedAndQuarantined: at start-up, an
// incoming container whose newest journal record is the destination's
// Done is adopted, not destroyed (its meta's write was lost), and one
// whose record cannot be read is kept, claimed, with its scratch data.
func TestPendingRecoveriesKeepsCommittedAndQuarantined(t *testing.T) {
	a := &Agent{cfg: Config{StateDir: t.TempDir()}, log: slog.New(slog.DiscardHandler),
		containers: map[string]*container{}, busy: map[string]bool{}, metrics: metrics.New(metrics.Gauges{})}
	j, err := journal.Open(filepath.Join(a.cfg.StateDir, "journal"))
	if err != nil {
		t.Fatal(err)
	}
	a.journal = j
	for _, name := range []string{"done", "damaged"} {
		if err := os.MkdirAll(a.dir(name), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := a.writeMeta(meta{Name: name, Incoming: true}); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(a.scratchDir(), name+"-in"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	put := func(name string, phases ...migration.Phase) string {
		id := journal.NewID()
		for _, p := range phases {
			if _, err := j.Put(journal.Record{ID: id, Role: migration.RoleDestination, Container: name, Peer: "node0",
				Strategy: migration.PreCopy, Phase: p}); err != nil {
				t.Fatal(err)
			}
		}
		return id
	}
	put("done", migration.Preparing, migration.Committed, migration.Done)
	bad := put("damaged", migration.Preparing, migration.Frozen)
	log := filepath.Join(j.Dir(), bad+".log")
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.SplitAfter(b, []byte("\n"))
	for _, l := range lines {
		if len(l) > 0 {
			l[0] = 'z' // every line's checksum is no longer hex
		}
	}
	if err := os.WriteFile(log, bytes.Join(lines, nil), 0o600); err != nil {
		t.Fatal(err)
	}
	pending, err := a.pendingRecoveries(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(pending) != 0 {
		t.Errorf("pending %+v, want none", pending)
	}
	if c, ok := a.containers["done"]; !ok || c.meta.Incoming {
		t.Errorf("the committed container was not adopted: %+v", a.containers["done"])
	}
	if m := a.readMeta("done"); m.Incoming {
		t.Error("the adopted container's meta still says incoming")
	}
	if _, err := os.Stat(a.dir("damaged")); err != nil {
		t.Errorf("the quarantined container was destroyed: %v", err)
	}
	if !a.busy["damaged"] {
		t.Error("the quarantined container is not claimed")
	}
	if _, err := os.Stat(filepath.Join(a.scratchDir(), "damaged-in")); err != nil {
		t.Errorf("the quarantined migration's scratch data went: %v", err)
	}
	if _, err := os.Stat(log); err != nil {
		t.Errorf("the unreadable log went: %v", err)
	}
}
