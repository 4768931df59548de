package journal

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/migration"
)

func rec(id string, p migration.Phase) Record {
	return Record{ID: id, Role: migration.RoleSource, Container: "redis", Peer: "node1",
		Strategy: migration.PreCopy, Phase: p, ImageDir: "/var/lib/edgehop/x/scratch/redis-out"}
}

func TestPutGetList(t *testing.T) {
	j, err := Open(filepath.Join(t.TempDir(), "journal"))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	j.now = func() time.Time { now = now.Add(time.Second); return now }
	a, b := NewID(), NewID()
	if _, err := j.Put(rec(a, migration.Frozen)); err != nil {
		t.Fatal(err)
	}
	if _, err := j.Put(rec(b, migration.Preparing)); err != nil {
		t.Fatal(err)
	}
	r := rec(a, migration.Committed)
	r.Started = time.Unix(1001, 0).UTC()
	if _, err := j.Put(r); err != nil {
		t.Fatal(err)
	}
	got, err := j.Get(a)
	if err != nil || got.Phase != migration.Committed || got.Updated.IsZero() {
		t.Fatalf("Get = %+v, %v", got, err)
	}
	if _, err := j.Get(NewID()); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get(unknown) err = %v, want ErrNotFound", err)
	}
	if _, err := j.Get("../../etc/passwd"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get(path) err = %v, want ErrNotFound", err)
	}
	// A stray file and a corrupt record are reported, not fatal.
	if err := os.WriteFile(filepath.Join(j.Dir(), "0123456789abcdef.log"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(j.Dir(), ".tmp-x"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	list, err := j.List()
	if len(list) != 2 || err == nil {
		t.Fatalf("List = %d records, err %v; want 2 and the corrupt file reported", len(list), err)
	}
	if list[0].ID != a {
		t.Errorf("List not oldest first: %v", list)
	}
}

func TestPutRefusesInvalid(t *testing.T) {
	j, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for name, r := range map[string]Record{
		"bad id":       rec("xyz", migration.Frozen),
		"bad phase":    rec(NewID(), "melted"),
		"bad name":     func() Record { r := rec(NewID(), migration.Frozen); r.Container = "../x"; return r }(),
		"auto":         func() Record { r := rec(NewID(), migration.Frozen); r.Strategy = migration.Auto; return r }(),
		"relative dir": func() Record { r := rec(NewID(), migration.Frozen); r.ImageDir = "a/../b"; return r }(),
	} {
		if _, err := j.Put(r); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
}

func TestPruneKeepsRunning(t *testing.T) {
	j, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	running := NewID()
	if _, err := j.Put(rec(running, migration.Transferred)); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		r := rec(NewID(), migration.Done)
		r.Started = time.Unix(int64(2000+i), 0)
		if _, err := j.Put(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := j.Prune(2); err != nil {
		t.Fatal(err)
	}
	list, _ := j.List()
	if len(list) != 3 {
		t.Fatalf("after Prune(2): %d records, want 3 (2 ended + the running one)", len(list))
	}
	if _, err := j.Get(running); err != nil {
		t.Errorf("running record pruned: %v", err)
	}
}

// A crash in the middle of an append leaves a torn line: the record
// before it stands. A line whose checksum fails is skipped the same way.
func TestTornAppend(t *testing.T) {
	j, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	id := NewID()
	for _, p := range []migration.Phase{migration.Preparing, migration.Frozen, migration.Transferred} {
		if _, err := j.Put(rec(id, p)); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(j.Dir(), id+".log")
	whole, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(whole), "\n")
	if len(lines) != 4 || lines[3] != "" {
		t.Fatalf("log has %d lines: %q", len(lines), whole)
	}
	// Torn: half of the third line, no newline.
	torn := lines[0] + lines[1] + lines[2][:len(lines[2])/2]
	if err := os.WriteFile(path, []byte(torn), 0o600); err != nil {
		t.Fatal(err)
	}
	if r, err := j.Get(id); err != nil || r.Phase != migration.Frozen {
		t.Fatalf("after a torn append: %v, %v; want phase frozen", r.Phase, err)
	}
	// Corrupt: the third line whole but one byte flipped.
	bad := []byte(lines[2])
	bad[20] ^= 1
	if err := os.WriteFile(path, []byte(lines[0]+lines[1]+string(bad)), 0o600); err != nil {
		t.Fatal(err)
	}
	if r, err := j.Get(id); err != nil || r.Phase != migration.Frozen {
		t.Fatalf("after a corrupt line: %v, %v; want phase frozen", r.Phase, err)
	}
	// Appending after a torn line still works: the next phase is read.
	if _, err := j.Put(rec(id, migration.Committed)); err != nil {
		t.Fatal(err)
	}
	if r, err := j.Get(id); err != nil || r.Phase != migration.Committed {
		t.Fatalf("after appending past a corrupt line: %v, %v", r.Phase, err)
	}
}

// A record appended after a torn last line, by the agent that restarts
// after the crash that tore it, is read: it does not run on from the torn
// line.
func TestAppendAfterTornLine(t *testing.T) {
	dir := t.TempDir()
	j, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	id := NewID()
	for _, p := range []migration.Phase{migration.Preparing, migration.Frozen} {
		if _, err := j.Put(rec(id, p)); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(dir, id+".log")
	whole, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(whole), "\n")
	if err := os.WriteFile(path, []byte(lines[0]+lines[1][:len(lines[1])/2]), 0o600); err != nil {
		t.Fatal(err)
	}
	j2, err := Open(dir) // the restarted agent's
	if err != nil {
		t.Fatal(err)
	}
	if r, err := j2.Get(id); err != nil || r.Phase != migration.Preparing {
		t.Fatalf("torn log: %v, %v; want phase preparing", r.Phase, err)
	}
	for _, p := range []migration.Phase{migration.RolledBack, migration.Done} {
		if _, err := j2.Put(rec(id, p)); err != nil {
			t.Fatal(err)
		}
		if r, err := j2.Get(id); err != nil || r.Phase != p {
			t.Fatalf("after appending %s past a torn line: %v, %v", p, r.Phase, err)
		}
	}
}

// Scan names each log that holds no valid record and the container it
// mentions, salvaged from lines that fail their checksum.
func TestScanSalvagesUnreadable(t *testing.T) {
	j, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	good, bad, none := NewID(), NewID(), NewID()
	for _, id := range []string{good, bad} {
		if _, err := j.Put(rec(id, migration.Committed)); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(j.Dir(), bad+".log")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[3] ^= 1 // the checksum
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(j.Dir(), none+".log"), []byte("garbage\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	recs, unreadable, err := j.Scan()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].ID != good {
		t.Fatalf("readable records %+v, want only %s", recs, good)
	}
	got := map[string]string{}
	for _, u := range unreadable {
		if !errors.Is(u.Err, ErrInvalid) {
			t.Errorf("%s: error %v, want ErrInvalid", u.ID, u.Err)
		}
		got[u.ID] = u.Container
	}
	if len(got) != 2 || got[bad] != "redis" || got[none] != "" {
		t.Fatalf("unreadable logs %v, want %s naming redis and %s naming none", got, bad, none)
	}
	if _, err := j.List(); err == nil {
		t.Fatal("List hid the unreadable logs")
	}
}

func FuzzDecodeLog(f *testing.F) {
	j, err := Open(f.TempDir())
	if err != nil {
		f.Fatal(err)
	}
	id := NewID()
	for _, p := range []migration.Phase{migration.Preparing, migration.Committed} {
		if _, err := j.Put(rec(id, p)); err != nil {
			f.Fatal(err)
		}
	}
	b, err := os.ReadFile(filepath.Join(j.Dir(), id+".log"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add(b[:len(b)-7])
	f.Add([]byte("00000000 {}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := DecodeLog(data)
		if err == nil {
			if verr := r.Validate(); verr != nil {
				t.Fatalf("decoded an invalid record: %v", verr)
			}
		}
	})
}

func FuzzDecode(f *testing.F) {
	b, _ := json.Marshal(rec("0123456789abcdef", migration.Frozen))
	f.Add(b)
	f.Add([]byte(`{"id":"0123456789abcdef"}`))
	f.Add([]byte(`{}{}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := Decode(data)
		if err != nil {
			return
		}
		// Whatever decodes is valid and round-trips.
		if verr := r.Validate(); verr != nil {
			t.Fatalf("decoded an invalid record: %v", verr)
		}
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		r2, err := Decode(b)
		if err != nil || r2.ID != r.ID || r2.Phase != r.Phase {
			t.Fatalf("round trip: %+v, %v", r2, err)
		}
	})
}

// A unit's commit is durable and idempotent, refused for a malformed id,
// kept while a record names the unit and pruned with the last one.
func TestCommitUnit(t *testing.T) {
	j, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	unit, other := NewID(), NewID()
	if j.UnitCommitted(unit) {
		t.Fatal("committed before CommitUnit")
	}
	for i := 0; i < 2; i++ {
		if err := j.CommitUnit(unit); err != nil {
			t.Fatalf("CommitUnit #%d: %v", i+1, err)
		}
	}
	if !j.UnitCommitted(unit) || j.UnitCommitted(other) {
		t.Fatal("UnitCommitted does not match what was committed")
	}
	if err := j.CommitUnit("../x"); !errors.Is(err, ErrInvalid) || j.UnitCommitted("../x") {
		t.Fatalf("malformed unit id: %v", err)
	}
	bad := rec(NewID(), migration.Frozen)
	bad.Unit = "not-an-id"
	if _, err := j.Put(bad); !errors.Is(err, ErrInvalid) {
		t.Fatalf("record with a malformed unit: %v", err)
	}

	// A member still in progress keeps the commit through a prune; once
	// its record is pruned, the commit goes too.
	member := rec(NewID(), migration.Transferred)
	member.Unit = unit
	if _, err := j.Put(member); err != nil {
		t.Fatal(err)
	}
	if err := j.CommitUnit(other); err != nil { // named by no record
		t.Fatal(err)
	}
	if err := j.Prune(0); err != nil {
		t.Fatal(err)
	}
	if !j.UnitCommitted(unit) || j.UnitCommitted(other) {
		t.Fatalf("after a prune: unit kept %v (want true), unnamed unit kept %v (want false)", j.UnitCommitted(unit), j.UnitCommitted(other))
	}
	member.Phase = migration.Done
	if _, err := j.Put(member); err != nil {
		t.Fatal(err)
	}
	if err := j.Prune(0); err != nil {
		t.Fatal(err)
	}
	if j.UnitCommitted(unit) {
		t.Fatal("the unit's commit outlived its last record")
	}
}

// PhaseIn reads a migration's phase as an outside observer does: ""
// for no record, a malformed id, or a log without a valid line.
func TestPhaseIn(t *testing.T) {
	j, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	id := NewID()
	if p := PhaseIn(j.Dir(), id); p != "" {
		t.Fatalf("no record: %q", p)
	}
	for _, p := range []migration.Phase{migration.Preparing, migration.Frozen} {
		if _, err := j.Put(rec(id, p)); err != nil {
			t.Fatal(err)
		}
	}
	if p := PhaseIn(j.Dir(), id); p != migration.Frozen {
		t.Fatalf("PhaseIn = %q, want frozen", p)
	}
	if p := PhaseIn(j.Dir(), "../"+id); p != "" {
		t.Fatalf("malformed id: %q", p)
	}
	if err := os.WriteFile(filepath.Join(j.Dir(), id+".log"), []byte("garbage\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if p := PhaseIn(j.Dir(), id); p != "" {
		t.Fatalf("unreadable log: %q", p)
	}
}
