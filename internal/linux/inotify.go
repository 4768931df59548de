package linux

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// ErrEventsLost: the kernel's inotify queue overflowed, so some files
// written meanwhile were not reported.
var ErrEventsLost = errors.New("inotify: queue overflowed, events lost")

// WatchWritten reports every file of dir that is written and closed, or
// moved there (IN_CLOSE_WRITE, IN_MOVED_TO), calling fn with its name on
// the watch's own goroutine, until fn returns false or the watch stops.
// If events were lost, or reading them failed, fn is not called again and
// lost (when not nil) receives the reason. The returned function stops the
// watch and waits for fn and lost to have returned.
func WatchWritten(dir string, fn func(name string) bool, lost func(error)) (stop func(), err error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CLOSE_WRITE|unix.IN_MOVED_TO); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("inotify watch %s: %w", dir, err)
	}
	// Non-blocking, so the runtime's poller reads it and Close ends a
	// pending Read.
	f := os.NewFile(uintptr(fd), "inotify")
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
		for {
			n, err := f.Read(buf)
			if err != nil {
				if !errors.Is(err, os.ErrClosed) && lost != nil {
					lost(fmt.Errorf("inotify read: %w", err))
				}
				return
			}
			more, overflow := true, false
			InotifyEvents(buf[:n], func(name string, mask uint32) bool {
				switch {
				case mask&unix.IN_Q_OVERFLOW != 0:
					overflow = true
				case mask&(unix.IN_CLOSE_WRITE|unix.IN_MOVED_TO) != 0:
					more = fn(name)
				}
				return more && !overflow
			})
			if overflow {
				if lost != nil {
					lost(ErrEventsLost)
				}
				return
			}
			if !more {
				return
			}
		}
	})
	return func() { f.Close(); wg.Wait() }, nil
}

// InotifyEvents calls yield with the name (NUL padding removed) and mask
// of each whole event in b, a read of an inotify descriptor, until yield
// returns false. A truncated event ends the walk.
func InotifyEvents(b []byte, yield func(name string, mask uint32) bool) {
	for len(b) >= unix.SizeofInotifyEvent {
		mask := binary.NativeEndian.Uint32(b[4:8])     // inotify_event.mask
		l := int(binary.NativeEndian.Uint32(b[12:16])) // inotify_event.len
		if l > len(b)-unix.SizeofInotifyEvent {
			return
		}
		name := string(bytes.TrimRight(b[unix.SizeofInotifyEvent:unix.SizeofInotifyEvent+l], "\x00"))
		if !yield(name, mask) {
			return
		}
		b = b[unix.SizeofInotifyEvent+l:]
	}
}

// RenameNoReplace renames src to dst, failing (EEXIST) rather than
// replacing anything at dst.
func RenameNoReplace(src, dst string) error {
	if err := unix.Renameat2(unix.AT_FDCWD, src, unix.AT_FDCWD, dst, unix.RENAME_NOREPLACE); err != nil {
		return &os.LinkError{Op: "rename", Old: src, New: dst, Err: err}
	}
	return nil
}
