//go:build failpoints

package agent

import (
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestFailpointArmed: with the build tag failpoints a failpoint is armed
// exactly while its file is in the state directory.
func TestFailpointArmed(t *testing.T) {
	dir := t.TempDir()
	a := &Agent{cfg: Config{StateDir: dir}, log: slog.New(slog.DiscardHandler)}
	if a.failpointArmed("unit-committed") {
		t.Fatal("failpoint armed without its file")
	}
	if err := os.WriteFile(filepath.Join(dir, "failpoint-unit-committed"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if !a.failpointArmed("unit-committed") {
		t.Error("failpoint-unit-committed present, failpoint not armed")
	}
	if a.failpointArmed("pod-member-restored") {
		t.Error("another failpoint's file arms pod-member-restored")
	}
}

// TestFailpointExits: an armed failpoint consumes its file and exits the
// process with status 137, as a crash would (run in a child: this test
// binary started again for that one test).
func TestFailpointExits(t *testing.T) {
	if dir := os.Getenv("EDGEHOP_TEST_FAILPOINT_DIR"); dir != "" {
		a := &Agent{cfg: Config{StateDir: dir}, log: slog.New(slog.DiscardHandler)}
		a.failpoint("unit-committed")
		os.Exit(0) // not reached when the failpoint fires
	}
	dir := t.TempDir()
	fp := filepath.Join(dir, "failpoint-unit-committed")
	if err := os.WriteFile(fp, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestFailpointExits$")
	cmd.Env = append(os.Environ(), "EDGEHOP_TEST_FAILPOINT_DIR="+dir)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 137 {
		t.Fatalf("armed failpoint: child ended with %v, want exit status 137\n%s", err, out)
	}
	if _, err := os.Stat(fp); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("failpoint file left after it fired: %v", err)
	}
}
