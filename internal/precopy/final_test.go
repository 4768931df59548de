package precopy

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
)

// TestFinalWithoutRounds sends a dump with no live round before it: the
// delta carries every page (zero pages as flags; copies refer only to
// what the rounds stored, so a repeated page goes twice) and the rebuilt
// directory still equals the dump. This is also what a migration gets
// when it skips the rounds.
func TestFinalWithoutRounds(t *testing.T) {
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

	source, err := NewSource(Config{Pid: os.Getpid()})
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
	if _, err := source.SendFinal(ctx, src2, t.TempDir()); !errors.Is(err, ErrBroken) {
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
	source.held[1] = map[uint64]uint64{a / PageSize: xxhash.Sum64(filled(9))}
	store := newTestStore(t)
	src, dst := connPair(t, nil)
	rebuilt := filepath.Join(dir, "rebuilt")
	done := make(chan error, 1)
	go func() {
		_, err := store.RebuildFinal(ctx, dst, rebuilt)
		done <- err
	}()
	_, serr := source.SendFinal(ctx, src, dump)
	rerr := <-done
	if !errors.Is(rerr, ErrCorrupt) {
		t.Fatalf("rebuild: %v (send: %v), want ErrCorrupt", rerr, serr)
	}
	if _, err := os.Stat(rebuilt); !os.IsNotExist(err) {
		t.Fatalf("failed rebuild left %s: %v", rebuilt, err)
	}
}
