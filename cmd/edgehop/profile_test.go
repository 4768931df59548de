package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestProfileUsage: bad flags are usage errors naming the fix, and an
// unknown testbed or node writes no file.
func TestProfileUsage(t *testing.T) {
	out := filepath.Join(t.TempDir(), "p.pprof")
	root := t.TempDir()
	for _, tc := range []struct {
		args  []string
		usage bool
		want  string
	}{
		{[]string{"--out", out}, true, "--node and --out are required"},
		{[]string{"--node", "node0"}, true, "--node and --out are required"},
		{[]string{"--node", "node0", "--out", out, "--seconds", "0"}, true, "not within 1..600"},
		{[]string{"--node", "node0", "--out", out, "--kind", "cpu2"}, true, `unknown --kind "cpu2"`},
		{[]string{"--node", "node0", "--out", out, "--root", root, "--testbed", "none"}, false, "testbed"},
	} {
		err := runProfile(t.Context(), tc.args)
		if err == nil || errors.Is(err, errUsage) != tc.usage || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("profile %s: err = %v, want %q (usage %v)", strings.Join(tc.args, " "), err, tc.want, tc.usage)
		}
		if _, serr := os.Stat(out); serr == nil {
			t.Fatalf("profile %s left %s behind", strings.Join(tc.args, " "), out)
		}
	}
}
