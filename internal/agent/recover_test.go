package agent

import (
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
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
