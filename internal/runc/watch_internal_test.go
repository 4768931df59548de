package runc

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestWatchWritten: the callback comes for the named file once written and
// closed, not for another file, and not after the watch stopped.
func TestWatchWritten(t *testing.T) {
	dir := t.TempDir()
	called := make(chan struct{}, 2)
	stop, err := watchWritten(dir, statsDumpFile, func() { called <- struct{}{} })
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "pages-1.img"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	select {
	case <-called:
		t.Fatal("called for another file")
	case <-time.After(100 * time.Millisecond):
	}
	if err := os.WriteFile(filepath.Join(dir, statsDumpFile), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	select {
	case <-called:
	case <-time.After(5 * time.Second):
		t.Fatal("no call 5 s after stats-dump was written")
	}
	stop()
	if err := os.WriteFile(filepath.Join(dir, statsDumpFile), []byte("y"), 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if len(called) != 0 {
		t.Error("called again")
	}
	// A stopped watch that never fired does not call.
	stop2, err := watchWritten(dir, "never", func() { t.Error("called") })
	if err != nil {
		t.Fatal(err)
	}
	stop2()
}
