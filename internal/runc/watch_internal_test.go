package runc

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
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

// FuzzInotifyEvents: any bytes as a read of inotify events; seen never
// panics, and finds a well-formed event's name.
func FuzzInotifyEvents(f *testing.F) {
	ev := func(name string) []byte {
		b := make([]byte, unix.SizeofInotifyEvent, unix.SizeofInotifyEvent+16)
		padded := make([]byte, 16)
		copy(padded, name)
		binary.NativeEndian.PutUint32(b[12:16], uint32(len(padded)))
		return append(b, padded...)
	}
	f.Add(ev(statsDumpFile))
	f.Add(append(ev("pages-1.img"), ev(statsDumpFile)...))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		_ = seen(b, statsDumpFile)
		if !seen(append(append([]byte(nil), ev("x")...), ev(statsDumpFile)...), statsDumpFile) {
			t.Fatal("a well-formed event not seen")
		}
	})
}
