package linux

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// inotifyEvent is one event as the kernel writes it, its name padded.
func inotifyEvent(name string, mask uint32) []byte {
	b := make([]byte, unix.SizeofInotifyEvent, unix.SizeofInotifyEvent+16)
	padded := make([]byte, 16)
	copy(padded, name)
	binary.NativeEndian.PutUint32(b[4:8], mask)
	binary.NativeEndian.PutUint32(b[12:16], uint32(len(padded)))
	return append(b, padded...)
}

// TestWatchWritten: names come for files written and closed or moved in,
// in order, until fn returns false; not after the watch stopped.
func TestWatchWritten(t *testing.T) {
	dir := t.TempDir()
	got := make(chan string, 8)
	stop, err := WatchWritten(dir, func(name string) bool {
		got <- name
		return name != "last"
	}, func(err error) { t.Errorf("lost: %v", err) })
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if err := os.WriteFile(filepath.Join(dir, "a"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(t.TempDir(), "b")
	if err := os.WriteFile(other, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(other, filepath.Join(dir, "b")); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"last", "after"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var names []string
	for len(names) < 3 {
		select {
		case n := <-got:
			names = append(names, n)
		case <-time.After(5 * time.Second):
			t.Fatalf("reported %v, then nothing for 5 s", names)
		}
	}
	if !slices.Equal(names, []string{"a", "b", "last"}) {
		t.Errorf("reported %v, want [a b last]", names)
	}
	select {
	case n := <-got:
		t.Errorf("reported %q after fn returned false", n)
	case <-time.After(100 * time.Millisecond):
	}
}

// TestInotifyEventsMasks: each event comes with its mask, so a queue
// overflow (IN_Q_OVERFLOW, no name) is told from a file's event.
func TestInotifyEventsMasks(t *testing.T) {
	b := append(inotifyEvent("a", unix.IN_CLOSE_WRITE), inotifyEvent("", unix.IN_Q_OVERFLOW)...)
	var masks []uint32
	var names []string
	InotifyEvents(b, func(name string, mask uint32) bool {
		names, masks = append(names, name), append(masks, mask)
		return true
	})
	if !slices.Equal(masks, []uint32{unix.IN_CLOSE_WRITE, unix.IN_Q_OVERFLOW}) || !slices.Equal(names, []string{"a", ""}) {
		t.Fatalf("names %q, masks %v", names, masks)
	}
}

// FuzzInotifyEvents: any bytes as a read of inotify events; the walk never
// panics, yields only names within the input, and finds well-formed
// events' names.
func FuzzInotifyEvents(f *testing.F) {
	f.Add(inotifyEvent("stats-dump", unix.IN_CLOSE_WRITE))
	f.Add(append(inotifyEvent("pages-1.img", unix.IN_CLOSE_WRITE), inotifyEvent("stats-dump", unix.IN_MOVED_TO)...))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		total := 0
		InotifyEvents(b, func(name string, _ uint32) bool { total += len(name); return true })
		if total > len(b) {
			t.Fatalf("names of %d bytes from %d bytes of events", total, len(b))
		}
		var names []string
		InotifyEvents(append(append([]byte(nil), inotifyEvent("x", 0)...), inotifyEvent("stats-dump", 0)...),
			func(name string, _ uint32) bool { names = append(names, name); return true })
		if !slices.Equal(names, []string{"x", "stats-dump"}) {
			t.Fatalf("well-formed events read as %v", names)
		}
	})
}
