//go:build !failpoints

package agent

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
)

// TestFailpointInertInProductBuild: without the build tag failpoints an
// armed failpoint file neither counts as armed nor makes the agent exit
// (the test would end here with status 137), and it stays where it is.
func TestFailpointInertInProductBuild(t *testing.T) {
	dir := t.TempDir()
	a := &Agent{cfg: Config{StateDir: dir}, log: slog.New(slog.DiscardHandler)}
	for _, name := range []string{"unit-committed", "pod-member-restored"} {
		fp := filepath.Join(dir, "failpoint-"+name)
		if err := os.WriteFile(fp, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if a.failpointArmed(name) {
			t.Errorf("failpoint %s armed in a build without the tag failpoints", name)
		}
		a.failpoint(name)
		if _, err := os.Stat(fp); err != nil {
			t.Errorf("failpoint %s: file consumed in a build without the tag failpoints: %v", name, err)
		}
	}
}
