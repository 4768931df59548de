package agent

import (
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/edgehop/edgehop/internal/api"
	"github.com/edgehop/edgehop/internal/migration"
)

func TestHeartbeatOf(t *testing.T) {
	cs := []api.Container{
		{Name: "redis", Status: "running", MemoryBytes: 10},
		{Name: "db", Status: "running", Group: "app", MemoryBytes: 300},
		{Name: "web", Status: "running", Group: "app", MemoryBytes: 100},
		{Name: "old", Status: "stopped", MemoryBytes: 0},
		{Name: "q", Status: "running", Group: "pod", MemoryBytes: 7},
		{Name: "w", Status: "running", Group: "pod", MemoryBytes: 5},
		{Name: "half", Status: "running", Group: "split"},
		{Name: "gone", Status: "stopped", Group: "split"},
	}
	hb := heartbeatOf("node0", "172.30.0.2", cs, map[string]bool{"w": true})
	want := api.Heartbeat{
		Node: "node0", Address: "172.30.0.2",
		Containers: []string{"redis", "db", "web", "q", "half"},
		Groups:     []string{"app"},
		Migrating:  []string{"pod", "w"},
		// A migrating member's pod runs nowhere whole, and a group with
		// a stopped member is not whole: neither reports memory.
		MemoryBytes: map[string]int64{"redis": 10, "db": 300, "web": 100, "app": 400, "q": 7},
	}
	if !reflect.DeepEqual(hb, want) {
		t.Errorf("heartbeat\n got %+v\nwant %+v", hb, want)
	}
	if hb := heartbeatOf("node1", "", nil, nil); hb.MemoryBytes != nil || hb.Containers != nil {
		t.Errorf("empty node: %+v", hb)
	}
}

// The history survives an overlong line (it is skipped, later results
// are read), cuts a result's error text, and reads the rotated file
// first.
func TestHistoryBounded(t *testing.T) {
	a := &Agent{cfg: Config{StateDir: t.TempDir()}, log: slog.New(slog.DiscardHandler)}
	path := filepath.Join(a.cfg.StateDir, historyFile)
	a.recordHistory(migration.Result{ID: "old"})
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	a.recordHistory(migration.Result{ID: "a", Error: strings.Repeat("e", 10*maxResultError)})
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(append([]byte(`{"id":"huge","error":"`+strings.Repeat("x", maxHistoryLine+10)+`"}`), '\n')); err != nil {
		t.Fatal(err)
	}
	f.Close()
	a.recordHistory(migration.Result{ID: "b"})
	var ids []string
	if err := a.history(func(r migration.Result) bool {
		ids = append(ids, r.ID)
		if r.ID == "a" && len(r.Error) > maxResultError+len("…") {
			t.Errorf("error text of %d bytes kept", len(r.Error))
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids, []string{"old", "a", "b"}) {
		t.Errorf("history %v, want [old a b]", ids)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("history file mode: %v, %v", st, err)
	}
}
