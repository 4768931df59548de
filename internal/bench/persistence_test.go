package bench

import (
	"strings"
	"testing"
)

func TestPersistenceConfigValidate(t *testing.T) {
	if err := DefaultPersistenceConfig().Validate(); err != nil {
		t.Fatalf("default config: %v", err)
	}
	for name, mut := range map[string]func(*PersistenceConfig){
		"no sizes":         func(c *PersistenceConfig) { c.SizesMB = nil },
		"size zero":        func(c *PersistenceConfig) { c.SizesMB = []int{0} },
		"size too large":   func(c *PersistenceConfig) { c.SizesMB = []int{20_000} },
		"value size zero":  func(c *PersistenceConfig) { c.ValueBytes = 0 },
		"unknown strategy": func(c *PersistenceConfig) { c.Strategies = []string{"teleport"} },
	} {
		c := DefaultPersistenceConfig()
		mut(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	c := DefaultPersistenceConfig()
	c.SizesMB, c.Quick = nil, true // quick brings its own sizes
	if err := c.Validate(); err != nil {
		t.Errorf("quick without sizes: %v", err)
	}
}

func TestPersistenceGoalsAndText(t *testing.T) {
	r := func(v float64) *float64 { return &v }
	rows := []PersistenceRow{
		{SizeMB: 64, Method: "edgehop stop-and-copy", OK: true, DowntimeMs: 500, DowntimeVsPersistence: r(2), ConnectionKept: true, DataVerified: true},
		{SizeMB: 64, Method: "edgehop post-copy", OK: true, DowntimeMs: 1200, DowntimeVsPersistence: r(1000.0 / 1200), ConnectionKept: true, DataVerified: true},
		{SizeMB: 64, Method: PersistenceMethod, OK: true, DowntimeMs: 1000, DataVerified: true},
		{SizeMB: 256, Method: "edgehop stop-and-copy", Error: "restore: boom"},
	}
	goals := persistenceGoals(rows)
	if len(goals) != 3 {
		t.Fatalf("%d goals, want one per live row", len(goals))
	}
	if !goals[0].Met || goals[1].Met || goals[2].Met || goals[2].Measured != nil {
		t.Errorf("goals %+v: want met, unmet, unmeasured", goals)
	}
	var b strings.Builder
	rep := &PersistenceReport{Rows: rows, Goals: goals}
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"2.0x", "0.8x", "FAILED: restore: boom", "connection kept", "not measured"} {
		if !strings.Contains(out, want) {
			t.Errorf("text lacks %q:\n%s", want, out)
		}
	}
}

func TestShellWords(t *testing.T) {
	got := shellWords([]string{"redis-server", "--save", "", "it's"})
	if want := `'redis-server' '--save' '' 'it'\''s'`; got != want {
		t.Errorf("shellWords = %s, want %s", got, want)
	}
}
