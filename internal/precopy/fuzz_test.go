package precopy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/edgehop/edgehop/internal/criuimg"
	"google.golang.org/protobuf/encoding/protowire"
)

// roundStream encodes a small valid round: data, zero, copy and XOR runs.
func roundStream() []byte {
	var e encoder
	e.single(roundBegin(&testHash, 1))
	page := bytes.Repeat([]byte{7}, PageSize)
	e.page(recData, 1, 0x10000, 0, 0, page)
	e.page(recData, 1, 0x11000, 0, 0, page)
	e.page(recZero, 1, 0x20000, 0, 0, nil)
	e.page(recCopy, 2, 0x30000, 1, 0x10000, nil)
	other := bytes.Clone(page)
	other[100] = 9
	e.xor(1, 0x11000, xorPage(other, page))
	e.flush()
	e.single(record{typ: recEnd, addr: e.pages, saddr: e.records})
	return e.buf
}

// FuzzDecoder: arbitrary bytes decode into records that pass their own
// checks, or fail with ErrCorrupt (or end of stream); never a panic or an
// allocation beyond the record bound.
func FuzzDecoder(f *testing.F) {
	f.Add(roundStream())
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, in []byte) {
		d := newDecoder(bytes.NewReader(in))
		for i := 0; i < 1000; i++ {
			r, err := d.next()
			if err != nil {
				if err != io.EOF && !errors.Is(err, ErrCorrupt) && !errors.Is(err, io.ErrUnexpectedEOF) {
					t.Fatalf("error neither corrupt nor end of stream: %v", err)
				}
				return
			}
			if err := r.check(); err != nil {
				t.Fatalf("returned a record failing its check: %v", err)
			}
			if len(r.data) > maxDataPages*PageSize {
				t.Fatalf("record of %d bytes", len(r.data))
			}
		}
	})
}

// FuzzApplyRound applies a peer's arbitrary round to a store: it fails
// cleanly or applies; the store then holds no more pages than the stream
// carried data for, plus the copies it made.
func FuzzApplyRound(f *testing.F) {
	f.Add(roundStream())
	f.Add(roundStream()[:100])
	f.Fuzz(func(t *testing.T, in []byte) {
		s, err := NewStore(filepath.Join(shmDir(t), "store"), nil)
		if err != nil {
			t.Fatalf("new store: %v", err)
		}
		defer s.Close()
		var st RoundStats
		err = s.applyRound(newDecoder(bytes.NewReader(in)), &st)
		if err != nil && !errors.Is(err, ErrCorrupt) && !errors.Is(err, errStreamDone) {
			t.Fatalf("error that is not ErrCorrupt: %v", err)
		}
		held, serr := s.StoredBytes()
		if serr != nil {
			t.Fatal(serr)
		}
		// Data pages arrive in the input; copies at most duplicate them.
		if limit := int64(2*len(in)) + 64*PageSize; held > limit {
			t.Fatalf("store holds %d bytes from %d bytes of input", held, len(in))
		}
	})
}

// finalStream encodes a valid final delta for a store that received
// roundStream: one pages image of held, XOR, data and zero pages of pid
// 1, and one without addresses holding a copy of pid 2's page.
func finalStream() []byte {
	hash := testHash
	page := bytes.Repeat([]byte{7}, PageSize)
	other := bytes.Clone(page) // what roundStream left at (1, 0x11000)
	other[100] = 9
	next, fresh := bytes.Clone(other), bytes.Repeat([]byte{3}, PageSize)
	next[200] = 1
	digest := func(pages ...[]byte) uint64 {
		d := xxhash.New()
		for _, p := range pages {
			d.Write(binary.LittleEndian.AppendUint64(nil, hash.sum(p)))
		}
		return d.Sum64()
	}
	var e encoder
	k0, k1 := hash.words()
	e.single(record{typ: recBegin, count: version, pid: kindFinal, addr: k0, saddr: k1})
	e.single(record{typ: recFile, count: 4, spid: 0o600, addr: 1})
	e.page(recHeld, 1, 0x10000, 0, 0, nil)
	e.xor(1, 0x11000, xorPage(next, other))
	e.page(recData, 1, 0x12000, 0, 0, fresh)
	e.page(recZero, 1, 0x20000, 0, 0, nil)
	e.flush()
	e.single(record{typ: recFileEnd, count: 4, addr: digest(page, next, fresh, zeroPage[:])})
	e.single(record{typ: recFile, count: 1, spid: 0o600, addr: 2})
	e.page(recCopy, 0, 0, 2, 0x30000, nil)
	e.flush()
	e.single(record{typ: recFileEnd, count: 1, addr: digest(page)})
	e.single(record{typ: recEnd, addr: e.pages, saddr: e.records})
	return e.buf
}

// finalFixture returns a store that received roundStream, closed when t
// ends, and an empty image directory.
func finalFixture(t *testing.T) (*Store, string) {
	root := shmDir(t)
	s, err := NewStore(filepath.Join(root, "store"), nil)
	if err != nil {
		t.Fatalf("new store: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	var rst RoundStats
	if err := s.applyRound(newDecoder(bytes.NewReader(roundStream())), &rst); !errors.Is(err, errStreamDone) {
		t.Fatalf("round: %v", err)
	}
	dir := filepath.Join(root, "img")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return s, dir
}

// TestFinalStreamValid: FuzzApplyFinal's seed rebuilds its two images.
func TestFinalStreamValid(t *testing.T) {
	s, dir := finalFixture(t)
	var st FinalStats
	fb := &finalBuilder{s: s, dir: dir, st: &st, kept: map[uint64][]keptRun{}}
	if err := fb.apply(newDecoder(bytes.NewReader(finalStream()))); !errors.Is(err, errStreamDone) {
		t.Fatalf("final: %v", err)
	}
	want := FinalStats{Images: 2, Pages: 5, DumpBytes: 5 * PageSize, HeldPages: 1, CopyPages: 1, ZeroPages: 1, DataPages: 2, XorPages: 1}
	if st != want {
		t.Fatalf("stats %+v, want %+v", st, want)
	}
	img1, err := os.ReadFile(filepath.Join(dir, "pages-1.img"))
	if err != nil {
		t.Fatal(err)
	}
	// The held page stays in the store: the image holds the other three.
	if len(img1) != 3*PageSize || img1[100] != 9 || img1[200] != 1 || img1[PageSize] != 3 || img1[2*PageSize+5] != 0 {
		t.Fatal("pages-1.img does not hold the XORed, data and zero pages")
	}
	if want := []keptRun{{pos: 0, pid: 1, addr: 0x10000, count: 1}}; len(fb.kept) != 1 || !slices.Equal(fb.kept[1], want) {
		t.Fatalf("kept %v, want image 1: %v", fb.kept, want)
	}

	// The same image twice is corrupt, not a file system error.
	hash := testHash
	var e encoder
	k0, k1 := hash.words()
	e.single(record{typ: recBegin, count: version, pid: kindFinal, addr: k0, saddr: k1})
	for range 2 {
		e.single(record{typ: recFile, count: 1, spid: 0o600, addr: 7})
		e.page(recZero, 0, 0, 0, 0, nil)
		e.flush()
		e.single(record{typ: recFileEnd, count: 1, addr: xxhash.Sum64(binary.LittleEndian.AppendUint64(nil, hash.sum(zeroPage[:])))})
	}
	e.single(record{typ: recEnd, addr: e.pages, saddr: e.records})
	fb = &finalBuilder{s: s, dir: dir, st: &FinalStats{}, kept: map[uint64][]keptRun{}}
	err = fb.apply(newDecoder(bytes.NewReader(e.buf)))
	fb.abandon()
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("an image sent twice: %v, want ErrCorrupt", err)
	}
}

// FuzzApplyFinal rebuilds pages images from a peer's arbitrary final
// delta over a store that received a round: it fails as corrupt or as a
// digest mismatch, or rebuilds images holding exactly the pages the
// delta announced; never a panic or another kind of error.
func FuzzApplyFinal(f *testing.F) {
	f.Add(finalStream())
	f.Add(finalStream()[:300])
	f.Fuzz(func(t *testing.T, in []byte) {
		s, dir := finalFixture(t)
		var st FinalStats
		fb := &finalBuilder{s: s, dir: dir, st: &st, kept: map[uint64][]keptRun{}}
		err := fb.apply(newDecoder(bytes.NewReader(in)))
		if aerr := fb.abandon(); aerr != nil {
			t.Fatalf("abandon: %v", aerr)
		}
		switch {
		case errors.Is(err, errStreamDone):
			ents, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			var size int64
			for _, e := range ents {
				fi, err := e.Info()
				if err != nil {
					t.Fatal(err)
				}
				size += fi.Size()
			}
			var kept int64
			for _, runs := range fb.kept {
				for _, r := range runs {
					kept += int64(r.count)
				}
			}
			if len(ents) != st.Images || size != st.DumpBytes-kept*PageSize || st.DumpBytes != st.Pages*PageSize || kept != st.HeldPages {
				t.Fatalf("%d images of %d bytes, stats say %d images, %d bytes, %d pages, %d held; %d kept", len(ents), size, st.Images, st.DumpBytes, st.Pages, st.HeldPages, kept)
			}
		case errors.Is(err, ErrCorrupt), errors.Is(err, ErrMismatch):
		default:
			t.Fatalf("error neither corrupt nor a mismatch: %v", err)
		}
	})
}

// FuzzPagemap decodes arbitrary pagemap images: runs it returns are
// aligned, non-empty and inside the address space.
func FuzzPagemap(f *testing.F) {
	img := binary.LittleEndian.AppendUint32(nil, criuimg.ImgCommonMagic)
	img = binary.LittleEndian.AppendUint32(img, criuimg.PagemapMagic)
	entry := func(fields ...uint64) {
		var m []byte
		for i := 0; i+1 < len(fields); i += 2 {
			m = protowire.AppendTag(m, protowire.Number(fields[i]), protowire.VarintType)
			m = protowire.AppendVarint(m, fields[i+1])
		}
		img = binary.LittleEndian.AppendUint32(img, uint32(len(m)))
		img = append(img, m...)
	}
	entry(1, 1)                            // head: pages_id 1
	entry(1, 0x400000, 5, 3, 4, pePresent) // 3 present pages
	entry(1, 0x403000, 2, 1)               // old-style count
	f.Add(img)
	f.Fuzz(func(t *testing.T, in []byte) {
		path := filepath.Join(t.TempDir(), "pagemap-1.img")
		if err := os.WriteFile(path, in, 0o600); err != nil {
			t.Fatal(err)
		}
		pm, err := readPagemap(path, 1)
		if err != nil {
			return
		}
		for _, r := range pm.runs {
			if r.count == 0 || r.addr%PageSize != 0 || r.addr >= maxAddr || r.count > (maxAddr-r.addr)/PageSize {
				t.Fatalf("run %+v", r)
			}
		}
	})
}

// FuzzSplitPagemap rewrites a peer's arbitrary pagemap image for one
// image's kept pages: it fails, leaving the image as it was, or the
// rewritten image marks exactly the kept pages PE_PARENT, keeps every
// other page it described, and still decodes.
func FuzzSplitPagemap(f *testing.F) {
	img := pagemapHeader(1)
	img = appendEntry(img, 0x400000, 4, pePresent)
	img = appendEntry(img, 0x800000, 1, peLazy)
	f.Add(img)
	f.Add(appendEntry(pagemapHeader(2), 0x401000, 2, pePresent))
	runs := []keptRun{{pos: 1, pid: 7, addr: 0x401000, count: 2}}
	f.Fuzz(func(t *testing.T, in []byte) {
		path := filepath.Join(t.TempDir(), "pagemap-7.img")
		if err := os.WriteFile(path, in, 0o600); err != nil {
			t.Fatal(err)
		}
		before := pagesOfMap(t, in)
		_, did, err := splitPagemap(path, 7, map[uint64][]keptRun{1: runs})
		after, rerr := os.ReadFile(path)
		if rerr != nil {
			t.Fatal(rerr)
		}
		if err != nil || !did {
			if !bytes.Equal(after, in) {
				t.Fatalf("a failed or skipped split (%v) changed the image", err)
			}
			return
		}
		got := pagesOfMap(t, after)
		if got == nil {
			t.Fatal("the rewritten pagemap does not decode")
		}
		for addr, flags := range before {
			want := flags
			if addr >= 0x401000 && addr < 0x403000 {
				want = flags&^pePresent | peParent
			}
			if got[addr] != want {
				t.Fatalf("page %#x: flags %#x, want %#x", addr, got[addr], want)
			}
		}
		if len(got) != len(before) {
			t.Fatalf("%d pages described, were %d", len(got), len(before))
		}
	})
}

// pagesOfMap decodes a pagemap image into the flags of each page it
// describes (nil if it does not decode or describes too many pages).
func pagesOfMap(t *testing.T, img []byte) map[uint64]uint64 {
	pm, err := criuimg.DecodePagemap(img)
	if err != nil {
		return nil
	}
	out := map[uint64]uint64{}
	err = pm.Entries(func(_ int, e criuimg.PagemapEntry) error {
		if e.Pages > 1<<12 || len(out) > 1<<14 {
			return errors.New("too many pages")
		}
		for i := range e.Pages {
			out[e.Vaddr+i*PageSize] = e.Flags
		}
		return nil
	})
	if err != nil {
		return nil
	}
	return out
}

// FuzzLazyRuns: a lazy dump's pagemap (on the destination, from the
// source) never panics LazyRuns; each run it returns is of the image's
// pid, page aligned, non-empty and within the address space, and runs
// that touch are joined.
func FuzzLazyRuns(f *testing.F) {
	img := pagemapHeader(1)
	img = appendEntry(img, 0x400000, 4, pePresent)
	img = appendEntry(img, 0x800000, 2, peLazy)
	img = appendEntry(img, 0x802000, 1, peLazy)
	img = appendEntry(img, 0x900000, 1, peLazy|pePresent)
	f.Add(img)
	f.Add(appendEntry(pagemapHeader(2), 0x401000, 2, peLazy))
	f.Fuzz(func(t *testing.T, in []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "pagemap-7.img"), in, 0o600); err != nil {
			t.Fatal(err)
		}
		runs, err := LazyRuns(dir)
		if err != nil {
			return
		}
		for i, r := range runs {
			if r.PID != 7 || r.Pages == 0 || r.Addr%PageSize != 0 || r.Addr >= maxAddr || r.Pages > (maxAddr-r.Addr)/PageSize {
				t.Fatalf("run %+v", r)
			}
			if i > 0 && runs[i-1].Addr+runs[i-1].Pages*PageSize == r.Addr {
				t.Fatalf("runs %+v and %+v touch but are not joined", runs[i-1], r)
			}
		}
	})
}
