package precopy

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/edgehop/edgehop/internal/transfer"
)

// shmDir returns a fresh directory on tmpfs, removed when the test ends.
func shmDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "precopy-test-")
	if err != nil {
		t.Fatalf("tmpfs dir: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func newTestStore(t *testing.T) *Store {
	t.Helper()
	s, err := NewStore(filepath.Join(shmDir(t), "store"), nil)
	if err != nil {
		t.Fatalf("new store: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// filled returns a page whose content is derived from seed.
func filled(seed uint64) []byte {
	p := make([]byte, PageSize)
	for i := 0; i < PageSize; i += 8 {
		seed = seed*6364136223846793005 + 1442695040888963407
		binary.LittleEndian.PutUint64(p[i:], seed)
	}
	return p
}

func TestNewStoreRefusesSmallFiles(t *testing.T) {
	// A file system without 2^57-byte files: ext4 (the root here) or
	// anything with a low s_maxbytes. Probe that /tmp is one.
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, "probe"))
	if err != nil {
		t.Fatal(err)
	}
	big := f.Truncate(maxAddr)
	f.Close()
	if big == nil {
		t.Skipf("skipped: %s holds 2^57-byte files, so there is nothing to refuse", dir)
	}
	_, err = NewStore(filepath.Join(dir, "store"), nil)
	if !errors.Is(err, ErrNotSupported) {
		t.Fatalf("NewStore on %s: %v, want ErrNotSupported", dir, err)
	}
	if _, serr := os.Stat(filepath.Join(dir, "store")); !os.IsNotExist(serr) {
		t.Fatalf("refused store left its directory behind: %v", serr)
	}
}

// TestStoreRound applies random rounds (data, zero pages, copies that
// overlap their source) to a store and to a map, and compares.
func TestStoreRound(t *testing.T) {
	s := newTestStore(t)
	model := map[pageLoc][]byte{}
	rng := rand.New(rand.NewPCG(1, 2))
	const base = 0x7f0000000000
	loc := func() pageLoc {
		return pageLoc{uint32(1 + rng.IntN(2)), base + uint64(rng.IntN(64))*PageSize}
	}
	var known []pageLoc
	for round := 1; round <= 20; round++ {
		var e encoder
		e.single(roundBegin(&testHash, round))
		for i := 0; i < 40; i++ {
			l := loc()
			n := 1 + rng.IntN(5) // a run of n pages from l
			switch k := rng.IntN(3); {
			case k == 0 || len(known) == 0:
				for j := 0; j < n; j++ {
					p := filled(rng.Uint64())
					a := l.addr + uint64(j)*PageSize
					e.page(recData, l.pid, a, 0, 0, p)
					model[pageLoc{l.pid, a}] = p
				}
			case k == 1:
				for j := 0; j < n; j++ {
					a := l.addr + uint64(j)*PageSize
					e.page(recZero, l.pid, a, 0, 0, nil)
					model[pageLoc{l.pid, a}] = zeroPage[:]
				}
			default:
				// Copy from somewhere near l in the same process, so
				// runs overlap their sources now and then.
				src := pageLoc{l.pid, l.addr + uint64(rng.IntN(5))*PageSize - 2*PageSize}
				if src.addr < base {
					src.addr = base
				}
				for j := 0; j < n; j++ {
					from := pageLoc{src.pid, src.addr + uint64(j)*PageSize}
					to := pageLoc{l.pid, l.addr + uint64(j)*PageSize}
					if from == to {
						break
					}
					if _, ok := model[from]; !ok {
						break // the source never held anything there
					}
					e.page(recCopy, to.pid, to.addr, from.pid, from.addr, nil)
					model[to] = model[from]
				}
			}
			known = append(known, l)
		}
		e.flush()
		e.single(record{typ: recEnd, addr: e.pages, saddr: e.records})
		var st RoundStats
		err := s.applyRound(newDecoder(bytes.NewReader(e.buf)), &st)
		if !errors.Is(err, errStreamDone) {
			t.Fatalf("round %d: %v", round, err)
		}
		if st.Round != round || st.Changed != int64(e.pages) {
			t.Fatalf("round %d: stats %+v, sent %d pages", round, st, e.pages)
		}
	}
	buf := make([]byte, PageSize)
	for l, want := range model {
		if err := s.read(l.pid, l.addr, buf); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf, want) {
			t.Fatalf("page %d/%#x differs from the model", l.pid, l.addr)
		}
	}
	if n, err := s.StoredBytes(); err != nil || n == 0 || n > int64(len(model))*PageSize {
		t.Fatalf("stored %d bytes (%v) for %d pages", n, err, len(model))
	}
}

// TestStoreRejectsBadRounds feeds streams that are well-formed record by
// record but wrong as a round.
func TestStoreRejectsBadRounds(t *testing.T) {
	begin := roundBegin(&testHash, 1)
	tests := []struct {
		name  string
		build func(e *encoder)
	}{
		{"no begin", func(e *encoder) { e.single(record{typ: recEnd}) }},
		{"final begin", func(e *encoder) { e.single(record{typ: recBegin, count: version, pid: kindFinal}) }},
		{"other version", func(e *encoder) { e.single(record{typ: recBegin, count: version + 1, pid: kindRound}) }},
		{"unkeyed version 1", func(e *encoder) { e.single(record{typ: recBegin, count: 1, pid: kindRound}) }},
		{"no end", func(e *encoder) { e.single(begin); e.page(recZero, 1, 0x1000, 0, 0, nil); e.flush() }},
		{"wrong end count", func(e *encoder) {
			e.single(begin)
			e.page(recZero, 1, 0x1000, 0, 0, nil)
			e.flush()
			e.single(record{typ: recEnd, addr: 2, saddr: 2})
		}},
		{"held in a round", func(e *encoder) {
			e.single(begin)
			e.page(recHeld, 1, 0x1000, 0, 0, nil)
			e.flush()
			e.single(record{typ: recEnd, addr: 1, saddr: 2})
		}},
		{"copy from an unknown pid", func(e *encoder) {
			e.single(begin)
			e.page(recCopy, 1, 0x1000, 9, 0x1000, nil)
			e.flush()
			e.single(record{typ: recEnd, addr: 1, saddr: 2})
		}},
		{"data after the end", func(e *encoder) {
			e.single(begin)
			e.single(record{typ: recEnd, addr: 0, saddr: 1})
			e.page(recZero, 1, 0x1000, 0, 0, nil)
			e.flush()
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newTestStore(t)
			var e encoder
			tt.build(&e)
			var st RoundStats
			err := s.applyRound(newDecoder(bytes.NewReader(e.buf)), &st)
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("got %v, want ErrCorrupt", err)
			}
		})
	}
}

// TestFinalBuilder rebuilds two pages images from a store and a delta of
// every record kind, then checks the content, the digest check and that
// the store released what the delta consumed.
func TestFinalBuilder(t *testing.T) {
	const a = 0x400000
	held := map[pageLoc][]byte{}
	var e encoder
	e.single(roundBegin(&testHash, 1))
	for i := uint64(0); i < 8; i++ {
		p := filled(i + 100)
		e.page(recData, 5, a+i*PageSize, 0, 0, p)
		held[pageLoc{5, a + i*PageSize}] = p
	}
	e.flush()
	e.single(record{typ: recEnd, addr: e.pages, saddr: e.records})
	// storeAfterRound is a store that received the round above.
	storeAfterRound := func(t *testing.T) *Store {
		s := newTestStore(t)
		var rst RoundStats
		if err := s.applyRound(newDecoder(bytes.NewReader(e.buf)), &rst); !errors.Is(err, errStreamDone) {
			t.Fatal(err)
		}
		return s
	}

	// Image 1 (pid 5): held, held, data, zero, copy of page 7, held.
	// Image 2 (no addresses): a copy of page 6 and data.
	fresh, other := filled(7), filled(8)
	img1 := [][]byte{held[pageLoc{5, a}], held[pageLoc{5, a + PageSize}], fresh, zeroPage[:], held[pageLoc{5, a + 7*PageSize}], held[pageLoc{5, a + 5*PageSize}]}
	img2 := [][]byte{held[pageLoc{5, a + 6*PageSize}], other}
	hash := testHash
	digest := func(pages [][]byte) uint64 {
		d := xxhash.New()
		for _, p := range pages {
			d.Write(binary.LittleEndian.AppendUint64(nil, hash.sum(p)))
		}
		return d.Sum64()
	}
	// build makes the delta, its begin record carrying seeded's seed.
	build := func(digest1 uint64, seeded pageHasher) []byte {
		var f encoder
		k0, k1 := seeded.words()
		f.single(record{typ: recBegin, count: version, pid: kindFinal, addr: k0, saddr: k1})
		f.single(record{typ: recFile, count: 6, spid: 0o644, addr: 1})
		f.page(recHeld, 5, a, 0, 0, nil)
		f.page(recHeld, 5, a+PageSize, 0, 0, nil)
		f.page(recData, 5, a+2*PageSize, 0, 0, fresh)
		f.page(recZero, 5, a+3*PageSize, 0, 0, nil)
		f.page(recCopy, 5, a+4*PageSize, 5, a+7*PageSize, nil)
		f.page(recHeld, 5, a+5*PageSize, 0, 0, nil)
		f.flush()
		f.single(record{typ: recFileEnd, count: 6, addr: digest1})
		f.single(record{typ: recFile, count: 2, spid: 0o600, addr: 3})
		f.page(recCopy, 0, 0, 5, a+6*PageSize, nil)
		f.page(recData, 0, 0, 0, 0, other)
		f.flush()
		f.single(record{typ: recFileEnd, count: 2, addr: digest(img2)})
		f.single(record{typ: recEnd, addr: f.pages, saddr: f.records})
		return f.buf
	}

	// mismatched: the delta fails its digest check (ErrMismatch) or
	// names another key than the round's (ErrCorrupt).
	mismatched := func(t *testing.T, delta []byte, want error) {
		s := storeAfterRound(t)
		dir := filepath.Join(shmDir(t), "img")
		os.Mkdir(dir, 0o755)
		var st FinalStats
		fb := &finalBuilder{s: s, dir: dir, st: &st, kept: map[uint64][]keptRun{}}
		err := fb.apply(newDecoder(bytes.NewReader(delta)))
		fb.abandon()
		if !errors.Is(err, want) {
			t.Fatalf("got %v, want %v", err, want)
		}
	}
	t.Run("digest mismatch", func(t *testing.T) { mismatched(t, build(digest(img1)^1, hash), ErrMismatch) })
	// The digests were taken under the source's key, the one the rounds
	// named: a final delta naming another fails.
	t.Run("another key", func(t *testing.T) { mismatched(t, build(digest(img1), newPageHasher()), ErrCorrupt) })

	s := storeAfterRound(t)
	dir := filepath.Join(shmDir(t), "img")
	os.Mkdir(dir, 0o755)
	var st FinalStats
	fb := &finalBuilder{s: s, dir: dir, st: &st, kept: map[uint64][]keptRun{}}
	if err := fb.apply(newDecoder(bytes.NewReader(build(digest(img1), hash)))); !errors.Is(err, errStreamDone) {
		t.Fatalf("rebuild: %v", err)
	}
	// The held pages (0, 1 and 5 of image 1) stay in the store.
	written1 := [][]byte{img1[2], img1[3], img1[4]}
	for _, c := range []struct {
		name  string
		pages [][]byte
		mode  os.FileMode
	}{{"pages-1.img", written1, 0o644}, {"pages-3.img", img2, 0o600}} {
		got, err := os.ReadFile(filepath.Join(dir, c.name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, bytes.Join(c.pages, nil)) {
			t.Errorf("%s differs from the pages it should hold", c.name)
		}
		if fi, _ := os.Stat(filepath.Join(dir, c.name)); fi.Mode().Perm() != c.mode {
			t.Errorf("%s has mode %v, want %v", c.name, fi.Mode().Perm(), c.mode)
		}
	}
	want := FinalStats{Images: 2, Pages: 8, DumpBytes: 8 * PageSize, HeldPages: 3, CopyPages: 2, ZeroPages: 1, DataPages: 2}
	if st != want {
		t.Errorf("stats %+v, want %+v", st, want)
	}
	wantKept := map[uint64][]keptRun{1: {{pos: 0, pid: 5, addr: a, count: 2}, {pos: 5, pid: 5, addr: a + 5*PageSize, count: 1}}}
	if !maps.EqualFunc(fb.kept, wantKept, slices.Equal) {
		t.Errorf("kept %v, want %v", fb.kept, wantKept)
	}
	// The store keeps its 8 pages: the restore reads the held ones there.
	stored, err := s.StoredBytes()
	if err != nil || stored != 8*PageSize {
		t.Errorf("store keeps %d bytes (%v), want its 8 pages", stored, err)
	}

	// Image 1's pagemap: pages 0–3 at a, then 4 and 5 at a+4 pages
	// (page 4 is the copy written there, page 5 held at a+5 pages).
	writePagemap(t, filepath.Join(dir, "pagemap-5.img"), 1, []pmEntry{{addr: a, pages: 4, flags: pePresent}, {addr: a + 4*PageSize, pages: 2, flags: pePresent}})
	if err := fb.linkParent(dir); err != nil {
		t.Fatalf("link parent: %v", err)
	}
	if got := memoryOf(t, dir, "pagemap-5.img"); !maps.EqualFunc(got, map[uint64][]byte{
		a: img1[0], a + PageSize: img1[1], a + 2*PageSize: img1[2], a + 3*PageSize: img1[3], a + 4*PageSize: img1[4], a + 5*PageSize: img1[5],
	}, bytes.Equal) {
		t.Errorf("pid 5's memory through the split pagemap and the parent is not image 1's")
	}
}

// applyRecords applies round records (without begin and end) directly.
func (s *Store) applyRecords(buf []byte) error {
	d := newDecoder(bytes.NewReader(buf))
	for {
		r, err := d.next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		switch r.typ {
		case recBegin:
			s.key(seedOf(r.addr, r.saddr))
		case recData:
			err = s.write(r.pid, r.addr, r.data)
		case recZero:
			err = s.punch(r.pid, r.addr, r.count)
		case recCopy:
			err = s.copy(r)
		}
		if err != nil {
			return err
		}
	}
}

// TestStoreMaxBytes: a round larger than the store's bound is refused
// with transfer.ErrTooLarge once past it; one within it is stored.
func TestStoreMaxBytes(t *testing.T) {
	var e encoder
	e.single(roundBegin(&testHash, 1))
	const pages = 64
	for i := uint64(0); i < pages; i++ {
		e.page(recData, 1, 0x10000+i*PageSize, 0, 0, filled(i))
	}
	e.flush()
	e.single(record{typ: recEnd, addr: e.pages, saddr: e.records})
	ctx := context.Background()
	for _, tc := range []struct {
		max int64
		ok  bool
	}{{0, true}, {int64(len(e.buf)), true}, {16 * PageSize, false}} {
		src, dst := connPair(t, nil)
		s := newTestStore(t)
		s.SetMaxBytes(tc.max)
		sent := make(chan error, 1)
		go func() {
			_, err := src.SendStream(ctx, bytes.NewReader(e.buf), transfer.SendOptions{})
			sent <- err
		}()
		_, err := s.ReceiveRound(ctx, dst)
		if tc.ok != (err == nil) || (!tc.ok && !errors.Is(err, transfer.ErrTooLarge)) {
			t.Errorf("bound %d, round of %d bytes: %v", tc.max, len(e.buf), err)
		}
		if tc.ok {
			if err := <-sent; err != nil {
				t.Errorf("send: %v", err)
			}
		}
	}
}
