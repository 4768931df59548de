package precopy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// DumpWatch follows a CRIU dump while it writes its images (inotify), so
// that SendFinal can send each process's pages as soon as CRIU is done
// with them rather than once the whole dump is. CRIU writes a process's
// pages image and its pagemap, closes both and goes on to the next
// process; an image closed after writing (or renamed into the directory)
// is complete. Create the watch before the dump starts writing.
type DumpWatch struct {
	dir  string
	file *os.File // the inotify descriptor
	done chan struct{}
	warn func(msg string, args ...any)

	mu      sync.Mutex
	maps    map[uint64]pagemap // closed pagemaps by the pages image they describe
	closed  map[uint64]bool    // closed pages images
	queued  map[uint64]bool    // pages images handed to ready already
	ready   []uint64           // pages images complete with their pagemap, in order
	err     error              // why the watch stopped early
	changed chan struct{}      // signalled (capacity 1) when ready or err changes
}

// WatchDump starts watching the image directory dir, which must exist.
// warn receives pagemaps the watch could not read (their images are then
// found by SendFinal's last sweep). Close stops it.
func WatchDump(dir string, warn func(msg string, args ...any)) (*DumpWatch, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("watch dump: inotify: %w", err)
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CLOSE_WRITE|unix.IN_MOVED_TO); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("watch dump %s: %w", dir, err)
	}
	if warn == nil {
		warn = func(string, ...any) {}
	}
	w := &DumpWatch{dir: dir, file: os.NewFile(uintptr(fd), "inotify"), done: make(chan struct{}), warn: warn,
		maps: map[uint64]pagemap{}, closed: map[uint64]bool{}, queued: map[uint64]bool{}, changed: make(chan struct{}, 1)}
	go w.run()
	return w, nil
}

// Close stops the watch and waits for it.
func (w *DumpWatch) Close() error {
	err := w.file.Close()
	<-w.done
	return err
}

func (w *DumpWatch) run() {
	defer close(w.done)
	buf := make([]byte, 64<<10)
	for {
		n, err := w.file.Read(buf)
		if err != nil {
			if !errors.Is(err, os.ErrClosed) {
				w.fail(fmt.Errorf("watch dump: %w", err))
			}
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			end := off + unix.SizeofInotifyEvent + int(ev.Len)
			if end > n {
				break
			}
			name := cString(buf[off+unix.SizeofInotifyEvent : end])
			off = end
			if ev.Mask&unix.IN_Q_OVERFLOW != 0 {
				w.fail(errors.New("watch dump: inotify queue overflowed"))
				return
			}
			if ev.Mask&(unix.IN_CLOSE_WRITE|unix.IN_MOVED_TO) != 0 {
				w.closedImage(name)
			}
		}
	}
}

// closedImage records that CRIU closed the image name after writing it.
func (w *DumpWatch) closedImage(name string) {
	if id, ok, err := pagesImageID(name); ok && err == nil {
		w.mu.Lock()
		w.closed[id] = true
		w.queueLocked(id)
		w.mu.Unlock()
		return
	}
	pid, ok, err := pagemapPID(name)
	if !ok || err != nil {
		return
	}
	pm, err := readPagemap(filepath.Join(w.dir, name), pid)
	if err != nil {
		w.warn("watch dump: pagemap left for the last sweep", "image", name, "err", err)
		return
	}
	w.mu.Lock()
	if _, dup := w.maps[pm.pagesID]; !dup {
		w.maps[pm.pagesID] = pm
		w.queueLocked(pm.pagesID)
	}
	w.mu.Unlock()
}

// queueLocked makes pages image id ready once it and its pagemap are
// both closed.
func (w *DumpWatch) queueLocked(id uint64) {
	if _, ok := w.maps[id]; !ok || !w.closed[id] || w.queued[id] {
		return
	}
	w.queued[id] = true
	w.ready = append(w.ready, id)
	w.signal()
}

func (w *DumpWatch) fail(err error) {
	w.mu.Lock()
	w.err = err
	w.mu.Unlock()
	w.signal()
}

func (w *DumpWatch) signal() {
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

// take returns the next pages image complete with its pagemap, if any,
// and the pagemap.
func (w *DumpWatch) take() (id uint64, pm pagemap, ok bool, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.ready) == 0 {
		return 0, pagemap{}, false, w.err
	}
	id, w.ready = w.ready[0], w.ready[1:]
	return id, w.maps[id], true, nil
}

// cString is b up to its first NUL (inotify pads names with them).
func cString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
