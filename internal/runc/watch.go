package runc

import (
	"bytes"
	"encoding/binary"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// statsDumpFile is the image CRIU writes last, and only when a dump
// succeeded (cr_dump_finish's write_stats).
const statsDumpFile = "stats-dump"

// watchWritten calls fn (once, on its own goroutine) when a file named
// name is written and closed in dir, or moved there. The returned
// function stops the watch and waits for fn to have returned.
func watchWritten(dir, name string, fn func()) (func(), error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, err
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CLOSE_WRITE|unix.IN_MOVED_TO); err != nil {
		unix.Close(fd)
		return nil, err
	}
	// Non-blocking, so the runtime's poller reads it and Close ends a
	// pending Read.
	f := os.NewFile(uintptr(fd), "inotify")
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
		for {
			n, err := f.Read(buf)
			if err != nil {
				return // closed
			}
			if seen(buf[:n], name) {
				fn()
				return
			}
		}
	}()
	return func() { f.Close(); wg.Wait() }, nil
}

// seen reports whether the inotify events in b name name.
func seen(b []byte, name string) bool {
	for len(b) >= unix.SizeofInotifyEvent {
		l := int(binary.NativeEndian.Uint32(b[12:16])) // inotify_event.len
		if unix.SizeofInotifyEvent+l > len(b) {
			return false
		}
		if string(bytes.TrimRight(b[unix.SizeofInotifyEvent:unix.SizeofInotifyEvent+l], "\x00")) == name {
			return true
		}
		b = b[unix.SizeofInotifyEvent+l:]
	}
	return false
}
