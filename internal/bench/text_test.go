package bench

import (
	"bytes"
	"strings"
	"testing"
)

func TestWriteText(t *testing.T) {
	ratio := 3.5
	r := &Report{
		Side: Side{Path: "edgehop stop-and-copy", Available: true, Runs: 2, GapMs: Summary{P50: 12.5, P99: 20, Max: 20},
			PhasesMs: map[string]Summary{"dump": {P50: 1}, "network": {P50: 2}}},
		Baseline: Side{Path: "podman 4.3.1 checkpoint/restore", Available: true, Runs: 2, GapMs: Summary{P50: 43.75},
			PhasesMs: map[string]Summary{"dump": {P50: 3}, "rm": {P50: 4}}},
		Ratio: &ratio,
		Sweep: []SweepRow{{SizeMB: 10, Path: "edgehop post-copy", Reason: "not available yet"}},
		Notes: []string{"a note"},
	}
	r.Goals = goals(r)
	var b bytes.Buffer
	if err := r.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"edgehop stop-and-copy", "podman 4.3.1", "12.5 / 20.0 / 20.0", "3.5x", "rm", "unavailable: not available yet", "a note"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	r.Baseline = Side{Path: "podman checkpoint/restore", Reason: "podman not installed"}
	r.Ratio = nil
	b.Reset()
	if err := r.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "unavailable: podman not installed") || !strings.Contains(b.String(), "not measured") {
		t.Errorf("unavailable baseline not shown:\n%s", b.String())
	}
}
