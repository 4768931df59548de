package api

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/edgehop/edgehop/internal/migration"
)

func TestJobMigrationResult(t *testing.T) {
	raw, err := json.Marshal(migration.Result{Container: "db", OK: true, Outcome: migration.OutcomeOK, DowntimeMs: 42})
	if err != nil {
		t.Fatal(err)
	}
	r, err := Job{ID: "j1", Container: "db", State: "ok", Result: raw}.MigrationResult()
	if err != nil || !r.OK || r.DowntimeMs != 42 || r.Container != "db" {
		t.Errorf("ended job: %+v, %v", r, err)
	}
	// Cancelled before it started: no result, a failed member all the same.
	r, err = Job{ID: "j2", Container: "web", From: "node0", To: "node1", State: "aborted"}.MigrationResult()
	if err != nil || r.OK || r.Container != "web" || r.Outcome != migration.OutcomeAborted || !strings.Contains(r.Error, "aborted") {
		t.Errorf("job without a result: %+v, %v", r, err)
	}
	if _, err := (Job{ID: "j3", Container: "web", Result: json.RawMessage(`{"ok":"yes"`)}).MigrationResult(); err == nil ||
		!strings.Contains(err.Error(), "j3") {
		t.Errorf("undecodable result: %v", err)
	}
}
