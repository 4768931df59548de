package precopy

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/testutil"
	"github.com/edgehop/edgehop/internal/transfer"
)

// TestFinalWithoutRounds sends a dump with no live round before it: the
// delta carries every page (zero pages as flags; copies refer only to
// what the rounds stored, so a repeated page goes twice) and the rebuilt
// directory still equals the dump. This is also what a migration gets
// when it skips the rounds.
//
// The image is read in one chunk, and mapped and read in chunks of two
// pages (the last one short).
func TestFinalWithoutRounds(t *testing.T) {
	for _, batch := range []int{0, 2 * PageSize} {
		t.Run(fmt.Sprintf("batch=%d", batch), func(t *testing.T) { testFinalWithoutRounds(t, batch) })
	}
}

func testFinalWithoutRounds(t *testing.T, batch int) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := shmDir(t)
	dump := filepath.Join(dir, "dump")
	if err := os.Mkdir(dump, 0o750); err != nil {
		t.Fatal(err)
	}
	const a = 0x7f0000000000
	writePagemap(t, filepath.Join(dump, "pagemap-1.img"), 1, []pmEntry{{addr: a, pages: 5, flags: pePresent}})
	pages := [][]byte{filled(1), zeroPage[:], filled(2), filled(1), filled(3)}
	var img []byte
	for _, p := range pages {
		img = append(img, p...)
	}
	for name, data := range map[string][]byte{"pages-1.img": img, "core-1.img": []byte("core"), "inventory.img": []byte("inv")} {
		if err := os.WriteFile(filepath.Join(dump, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("core-1.img", filepath.Join(dump, "link")); err != nil {
		t.Fatal(err)
	}

	source, err := NewSource(Config{Pid: os.Getpid(), BatchBytes: batch})
	if err != nil {
		t.Fatal(err)
	}
	store := newTestStore(t)
	src, dst := connPair(t, nil)
	rebuilt := filepath.Join(dir, "rebuilt")
	f, _ := doFinal(t, ctx, source, store, src, dst, dump, rebuilt)
	sameTree(t, dump, rebuilt)
	want := FinalStats{Images: 1, Pages: 5, DumpBytes: 5 * PageSize, ZeroPages: 1, DataPages: 4}
	f.MetaBytes, f.DeltaBytes, f.Duration = 0, 0, 0
	if f != want {
		t.Fatalf("final %+v, want %+v", f, want)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.Name() != "dump" && e.Name() != "rebuilt" && e.Name() != "store" {
			t.Errorf("left behind: %s", e.Name())
		}
	}
}

// TestFailedRoundIsSticky breaks the connection under a round: the
// source cannot know what the destination holds, so it refuses further
// rounds and the final delta with ErrBroken.
func TestFailedRoundIsSticky(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// This test process is the tree copied: it is running, which is all
	// a round needs.
	source, err := NewSource(Config{Pid: os.Getpid()})
	if err != nil {
		t.Fatal(err)
	}
	src, dst := connPair(t, nil)
	dst.Close()
	if _, err := source.Round(ctx, src); !errors.Is(err, ErrBroken) {
		t.Fatalf("round over a closed connection: %v, want ErrBroken", err)
	}
	src2, _ := connPair(t, nil)
	if _, err := source.Round(ctx, src2); !errors.Is(err, ErrBroken) {
		t.Fatalf("round after a failed one: %v, want ErrBroken", err)
	}
	if _, err := source.SendFinal(ctx, src2, t.TempDir(), nil, nil, nil); !errors.Is(err, ErrBroken) {
		t.Fatalf("final after a failed round: %v, want ErrBroken", err)
	}
	// Rounds stops at an announcement that fails, before any round.
	fresh, _ := NewSource(Config{Pid: os.Getpid()})
	boom := errors.New("peer gone")
	hist, _, err := fresh.Rounds(ctx, src2, StopRule{MaxRounds: 3}, func(context.Context, int) error { return boom })
	if !errors.Is(err, boom) || len(hist) != 0 {
		t.Fatalf("rounds with a failing announcement: %d rounds, %v", len(hist), err)
	}
}

// TestRebuildFailureLeavesNothing makes the rebuild fail (the store
// lacks a page the delta refers to) and checks the image directory is
// gone.
func TestRebuildFailureLeavesNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := shmDir(t)
	dump := filepath.Join(dir, "dump")
	os.Mkdir(dump, 0o755)
	const a = 0x400000
	writePagemap(t, filepath.Join(dump, "pagemap-1.img"), 1, []pmEntry{{addr: a, pages: 1, flags: pePresent}})
	os.WriteFile(filepath.Join(dump, "pages-1.img"), filled(9), 0o644)
	source, err := NewSource(Config{Pid: os.Getpid()})
	if err != nil {
		t.Fatal(err)
	}
	// The source believes the destination holds the page; it does not.
	source.held[1] = map[uint64]uint64{a / PageSize: source.hash.sum(filled(9))}
	store := newTestStore(t)
	src, dst := connPair(t, nil)
	rebuilt := filepath.Join(dir, "rebuilt")
	done := make(chan error, 1)
	go func() {
		_, err := store.RebuildFinal(ctx, dst, rebuilt)
		done <- err
	}()
	_, serr := source.SendFinal(ctx, src, dump, nil, nil, nil)
	rerr := <-done
	if !errors.Is(rerr, ErrCorrupt) {
		t.Fatalf("rebuild: %v (send: %v), want ErrCorrupt", rerr, serr)
	}
	requireGone(t, rebuilt, PagesDir(rebuilt))
}

// followDump is a dump directory being written, a watch on it, and a
// final delta under way from it to a rebuilt directory.
type followDump struct {
	dump, rebuilt    string
	dumped, stop     chan struct{}
	sent, rebuiltErr chan error
	src, dst         *transfer.Conn
	early            int             // SendFinal's EarlyImages, once sent has its error
	ctx              context.Context // both sides' (a minute, ended with the test)
}

func startFollow(t *testing.T) *followDump {
	t.Helper()
	return startFollowWatch(t, nil)
}

// startFollowWatch is startFollow with hook called on the watch before
// the final delta starts.
func startFollowWatch(t *testing.T, hook func(*DumpWatch)) *followDump {
	t.Helper()
	dir := shmDir(t)
	f := &followDump{dump: filepath.Join(dir, "dump"), rebuilt: filepath.Join(dir, "rebuilt"), dumped: make(chan struct{}), stop: make(chan struct{}),
		sent: make(chan error, 1), rebuiltErr: make(chan error, 1)}
	if err := os.Mkdir(f.dump, 0o750); err != nil {
		t.Fatal(err)
	}
	w, err := WatchDump(f.dump, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	if hook != nil {
		hook(w)
	}
	source, err := NewSource(Config{Pid: os.Getpid()})
	if err != nil {
		t.Fatal(err)
	}
	store := newTestStore(t)
	src, dst := connPair(t, nil)
	f.src, f.dst = src, dst
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	f.ctx = ctx
	go func() {
		_, err := store.RebuildFinal(ctx, dst, f.rebuilt)
		f.rebuiltErr <- err
	}()
	go func() {
		st, err := source.SendFinal(ctx, src, f.dump, w, f.dumped, f.stop)
		f.early = st.EarlyImages
		f.sent <- err
	}()
	t.Cleanup(cancel)
	return f
}

// writeProcess writes a process's pagemap and pages image as CRIU does:
// pages first, each closed once written.
func (f *followDump) writeProcess(t *testing.T, pid uint32, id uint64, pages ...[]byte) {
	t.Helper()
	var img []byte
	for _, p := range pages {
		img = append(img, p...)
	}
	if err := os.WriteFile(filepath.Join(f.dump, fmt.Sprintf("pages-%d.img", id)), img, 0o644); err != nil {
		t.Fatal(err)
	}
	writePagemap(t, filepath.Join(f.dump, fmt.Sprintf("pagemap-%d.img", pid)), id,
		[]pmEntry{{addr: 0x7f0000000000, pages: uint64(len(pages)), flags: pePresent}})
}

// waitArrived waits until the destination holds the pages image name,
// pages long, in its pages directory: sent while the dump goes on.
func (f *followDump) waitArrived(t *testing.T, name string, pages int) {
	t.Helper()
	path := filepath.Join(PagesDir(f.rebuilt), name)
	testutil.Eventually(t, 10*time.Second, func() error {
		if fi, err := os.Stat(path); err != nil || fi.Size() != int64(pages)*PageSize {
			return fmt.Errorf("%s not at the destination before the dump ended (%v)", name, err)
		}
		return nil
	})
}

// complete ends the dump and requires the send and the rebuild to succeed
// with a rebuilt directory equal to the dump.
func (f *followDump) complete(t *testing.T) {
	t.Helper()
	close(f.dumped)
	if err := <-f.sent; err != nil {
		t.Fatalf("send: %v", err)
	}
	if err := <-f.rebuiltErr; err != nil {
		t.Fatalf("rebuild: %v", err)
	}
	sameTree(t, f.dump, f.rebuilt)
}

// requireGone fails the test for each of paths that exists.
func requireGone(t *testing.T, paths ...string) {
	t.Helper()
	for _, p := range paths {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("left behind %s: %v", p, err)
		}
	}
}

// TestFinalFollowsDump: with a DumpWatch, a process's pages reach the
// destination while the dump is still being written (before dumped), the
// images the watch could not report (a pages image with no pagemap yet)
// go after it, and the rebuilt directory equals the dump.
func TestFinalFollowsDump(t *testing.T) {
	f := startFollow(t)
	f.writeProcess(t, 1, 1, filled(1), filled(2))
	// Process 1's pages cross while CRIU would still dump.
	f.waitArrived(t, "pages-1.img", 2)
	f.writeProcess(t, 2, 2, filled(3))
	// A pages image whose pagemap never comes: only the sweep finds it.
	if err := os.WriteFile(filepath.Join(f.dump, "pages-9.img"), filled(4), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string]string{"core-1.img": "core", "inventory.img": "inv", "stats-dump": "stats"} {
		if err := os.WriteFile(filepath.Join(f.dump, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f.complete(t)
	// Process 1's went early; process 2's may have; pages-9's could not.
	if f.early < 1 || f.early > 2 {
		t.Errorf("%d pages images counted as sent early, want 1 or 2", f.early)
	}
	requireGone(t, PagesDir(f.rebuilt))
}

// TestFinalFollowRefusesRewrittenImage: a pages image that changes after
// it was sent early (CRIU writes each once; anything else would leave the
// destination's copy stale) fails the final delta rather than pass.
func TestFinalFollowRefusesRewrittenImage(t *testing.T) {
	f := startFollow(t)
	f.writeProcess(t, 1, 1, filled(1))
	f.waitArrived(t, "pages-1.img", 1)
	img := filepath.Join(f.dump, "pages-1.img")
	if err := os.WriteFile(img, append(filled(1), filled(2)...), 0o644); err != nil {
		t.Fatal(err)
	}
	writePagemap(t, filepath.Join(f.dump, "pagemap-1.img"), 1, []pmEntry{{addr: 0x7f0000000000, pages: 2, flags: pePresent}})
	close(f.dumped)
	if err := <-f.sent; err == nil || !strings.Contains(err.Error(), "changed after it was sent") {
		t.Fatalf("send: %v, want the rewritten image named", err)
	}
	if err := <-f.rebuiltErr; err == nil {
		t.Fatal("the rebuild succeeded from a stale image")
	}
	requireGone(t, f.rebuilt, PagesDir(f.rebuilt))
}

// TestFinalFollowDumpFails: a dump that fails while its pages cross ends
// the delta with an abort: the destination's rebuild fails and leaves
// nothing, and the connection stays usable for the reason.
func TestFinalFollowDumpFails(t *testing.T) {
	f := startFollow(t)
	f.writeProcess(t, 1, 1, filled(1))
	f.waitArrived(t, "pages-1.img", 1)
	close(f.stop)
	if err := <-f.sent; !errors.Is(err, ErrDumpFailed) {
		t.Fatalf("send: %v, want ErrDumpFailed", err)
	}
	if err := <-f.rebuiltErr; !errors.Is(err, transfer.ErrAborted) {
		t.Fatalf("rebuild: %v, want the sender's abort", err)
	}
	requireGone(t, f.rebuilt, PagesDir(f.rebuilt))
	if err := f.src.WriteMsg(f.ctx, "abort", nil); err != nil {
		t.Fatalf("the connection after the abort: %v", err)
	}
	if typ, _, err := f.dst.ReadMsg(f.ctx); err != nil || typ != "abort" {
		t.Fatalf("the reason after the abort: %q, %v", typ, err)
	}
}

// TestFinalFollowWatchSilent: a watch that reports nothing (stopped, or
// its events lost) costs only the overlap: every image goes once the dump
// is done, and the rebuilt directory still equals the dump.
func TestFinalFollowWatchSilent(t *testing.T) {
	f := startFollowWatch(t, func(w *DumpWatch) { w.Close() })
	f.writeProcess(t, 1, 1, filled(1), filled(2))
	f.writeProcess(t, 2, 2, filled(3))
	if err := os.WriteFile(filepath.Join(f.dump, "core-1.img"), []byte("core"), 0o644); err != nil {
		t.Fatal(err)
	}
	f.complete(t)
	if f.early != 0 {
		t.Errorf("%d images counted as early from a silent watch", f.early)
	}
}

// TestFinalImageShrunkUnderItsMapping reads a pages image that shrinks
// after it was mapped: the pages past its new end fault, and the final
// delta fails with an error naming the image instead of crashing the
// agent with SIGBUS.
func TestFinalImageShrunkUnderItsMapping(t *testing.T) {
	dir := shmDir(t)
	var img []byte
	for i := range 4 {
		img = append(img, filled(uint64(i+1))...)
	}
	path := filepath.Join(dir, "pages-1.img")
	if err := os.WriteFile(path, img, 0o644); err != nil {
		t.Fatal(err)
	}
	im, err := statPagesImage(dir, 1)
	if err != nil {
		t.Fatal(err)
	}
	// Chunks of two pages: the image, larger, is mapped.
	source, err := NewSource(Config{Pid: os.Getpid(), BatchBytes: 2 * PageSize})
	if err != nil {
		t.Fatal(err)
	}
	gave := false
	next := func() (pagesImage, bool, error) {
		if gave {
			return pagesImage{}, false, nil
		}
		gave = true
		return im, true, nil
	}
	fr := &finalReader{s: source, ctx: context.Background(), next: next, st: &FinalStats{}}
	defer fr.closeImage()
	for fr.file == nil {
		if err := fr.produce(); err != nil {
			t.Fatal(err)
		}
	}
	if fr.mem == nil {
		t.Fatal("an image of 4 pages read in chunks of 2 was not mapped")
	}
	if err := os.Truncate(path, PageSize); err != nil {
		t.Fatal(err)
	}
	err = fr.produce()
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "fault") {
		t.Fatalf("reading a shrunk image: %v, want a fault naming %s", err, path)
	}
	if fr.st.Pages != 1 {
		t.Errorf("%d pages encoded before the fault, want the 1 still in the file", fr.st.Pages)
	}
}
