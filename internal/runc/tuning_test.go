package runc

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFrozenWindowHints(t *testing.T) {
	dir := t.TempDir()
	rcu, ct := filepath.Join(dir, "rcu"), filepath.Join(dir, "ct")
	write := func(p, v string) {
		t.Helper()
		if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(rcu, "0")
	write(ct, "262144")
	h := frozenWindowHints(rcu, ct)
	if len(h) != 2 || !strings.Contains(h[0], "echo 1 > "+rcu) || !strings.Contains(h[1], "echo 16384 > "+ct) {
		t.Fatalf("hints = %q", h)
	}
	write(rcu, "1")
	write(ct, "16384")
	if h := frozenWindowHints(rcu, ct); len(h) != 0 {
		t.Fatalf("tuned host: hints = %q", h)
	}
	if h := frozenWindowHints(filepath.Join(dir, "none"), filepath.Join(dir, "none")); len(h) != 0 {
		t.Fatalf("unreadable settings: hints = %q", h)
	}
}
