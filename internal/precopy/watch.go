package precopy

import (
	"fmt"
	"path/filepath"
	"sync"

	"github.com/edgehop/edgehop/internal/linux"
)

// DumpWatch follows a CRIU dump while it writes its images (inotify,
// linux.WatchWritten), so that SendFinal can send each process's pages as
// soon as CRIU is done with them rather than once the whole dump is. CRIU
// writes a process's pages image and its pagemap, closes both and goes on
// to the next process; an image closed after writing (or renamed into the
// directory) is complete. Create the watch before the dump starts writing.
type DumpWatch struct {
	dir  string
	stop func() // ends the inotify watch
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
	if warn == nil {
		warn = func(string, ...any) {}
	}
	w := &DumpWatch{dir: dir, warn: warn,
		maps: map[uint64]pagemap{}, closed: map[uint64]bool{}, queued: map[uint64]bool{}, changed: make(chan struct{}, 1)}
	stop, err := linux.WatchWritten(dir, func(name string) bool {
		w.closedImage(name)
		return true
	}, w.fail)
	if err != nil {
		return nil, fmt.Errorf("watch dump: %w", err)
	}
	w.stop = stop
	return w, nil
}

// Close stops the watch and waits for it. It may be called more than once.
func (w *DumpWatch) Close() { w.stop() }

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

// fail records why the watch stopped early (linux.WatchWritten's lost).
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
