package precopy

import (
	"bytes"
	"errors"
	"path/filepath"
	"testing"
)

func TestShadows(t *testing.T) {
	s := newShadows(2 * PageSize)
	a, b, c := pageLoc{1, 0x1000}, pageLoc{1, 0x2000}, pageLoc{2, 0x1000}
	s.put(a, 11, pageOf(1), false)
	s.put(b, 22, pageOf(2), false)
	s.put(c, 33, pageOf(3), false) // over the bound: not kept
	if got := s.get(a, 11); !bytes.Equal(got, pageOf(1)) {
		t.Fatalf("a: got %v", got[:4])
	}
	if s.get(c, 33) != nil {
		t.Fatal("a page beyond the bound was kept")
	}
	if s.get(a, 12) != nil {
		t.Fatal("a copy whose hash is not what the destination holds was returned")
	}
	s.put(a, 12, pageOf(4), true) // a changed: the destination now holds another page there
	if got := s.get(a, 12); !bytes.Equal(got, pageOf(4)) {
		t.Fatal("a's copy was not replaced")
	}
	s.drop(b)
	if s.get(b, 22) != nil {
		t.Fatal("a dropped page was returned")
	}
	s.put(c, 33, pageOf(3), false) // reuses b's slot
	if got := s.get(c, 33); !bytes.Equal(got, pageOf(3)) || len(s.pages) != 2 {
		t.Fatalf("c not kept in the freed slot (%d pages kept)", len(s.pages))
	}
	// Full: a hot page takes the place of a first-round page that did
	// not change (c), never of a hot one (a).
	d, e := pageLoc{3, 0x1000}, pageLoc{3, 0x2000}
	s.put(d, 44, pageOf(5), true)
	if got := s.get(d, 44); !bytes.Equal(got, pageOf(5)) || s.get(c, 33) != nil || s.get(a, 12) == nil {
		t.Fatal("a hot page did not take the cold page's place")
	}
	s.put(e, 55, pageOf(6), true)
	if s.get(e, 55) != nil || s.get(a, 12) == nil || s.get(d, 44) == nil {
		t.Fatal("a hot page took another hot page's place")
	}
	if off := newShadows(-1); off.max != 0 {
		t.Fatalf("negative bound keeps %d pages", off.max)
	}
}

func TestShadowsShare(t *testing.T) {
	s := newShadows(2 * PageSize)
	a, b, c := pageLoc{1, 0x1000}, pageLoc{2, 0x1000}, pageLoc{3, 0x1000}
	s.put(a, 11, pageOf(1), false)
	s.share(b, a, 11) // b got a copy of a
	s.share(c, a, 99) // not what a holds: nothing shared
	if got := s.get(b, 11); !bytes.Equal(got, pageOf(1)) || s.get(c, 99) != nil || s.n != 1 {
		t.Fatalf("share: b %v, c %v, %d pages allocated", got != nil, s.get(c, 99) != nil, s.n)
	}
	// b changes: it gets a page of its own, a keeps its content.
	s.put(b, 22, pageOf(2), true)
	if !bytes.Equal(s.get(a, 11), pageOf(1)) || !bytes.Equal(s.get(b, 22), pageOf(2)) || s.n != 2 {
		t.Fatal("a change of a shared page changed the other address's copy")
	}
	// a copy's page stays as long as one address holds it.
	s.share(c, a, 11)
	s.drop(a)
	if !bytes.Equal(s.get(c, 11), pageOf(1)) || len(s.free) != 0 {
		t.Fatal("dropping one address of a shared page freed it")
	}
	s.drop(c)
	if len(s.free) != 1 {
		t.Fatalf("%d free pages once no address holds a's, want 1", len(s.free))
	}
	// Full, with only cold addresses on a shared page: a hot page
	// forgets all of them.
	s = newShadows(1 * PageSize)
	s.put(a, 11, pageOf(1), false)
	s.share(b, a, 11)
	s.put(c, 33, pageOf(3), true)
	if s.get(a, 11) != nil || s.get(b, 11) != nil || !bytes.Equal(s.get(c, 33), pageOf(3)) {
		t.Fatal("a hot page did not take the place of a cold shared page")
	}
}

func TestXorWorth(t *testing.T) {
	a := pageOf(1)
	b := bytes.Clone(a)
	x := make([]byte, PageSize)
	if !xorIfWorth(x, a, b) || !bytes.Equal(x, make([]byte, PageSize)) {
		t.Fatal("identical pages")
	}
	// A quarter of the words differ: still worth it; one more: not.
	for w := 0; w < PageSize/32; w++ {
		b[w*32] = 2
	}
	if !xorIfWorth(x, a, b) {
		t.Fatal("a quarter of the words differ")
	}
	if !bytes.Equal(x, xorPage(a, b)) {
		t.Fatal("the XOR is not a XOR b")
	}
	b[8] = 2
	if xorIfWorth(x, a, b) {
		t.Fatal("more than a quarter of the words differ")
	}
	// Differences anywhere count, the last word too.
	c := bytes.Clone(a)
	for w := PageSize/8 - PageSize/32 - 1; w < PageSize/8; w++ {
		c[w*8+7] ^= 0x80
	}
	if xorIfWorth(x, a, c) {
		t.Fatal("more than a quarter of the words differ at the page's end")
	}
}

// TestXorRecord: an XOR record round-trips through the encoder and
// turns the page the store holds into the new one.
func TestXorRecord(t *testing.T) {
	const a = 0x7f0000000000
	old0, old1 := pageOf(1), pageOf(2)
	new0, new1 := bytes.Clone(old0), bytes.Clone(old1)
	new0[17], new1[4095] = 0xff, 0

	var e encoder
	e.single(roundBegin(&testHash, 1))
	e.page(recData, 5, a, 0, 0, old0)
	e.page(recData, 5, a+PageSize, 0, 0, old1)
	e.flush()
	e.single(record{typ: recEnd, addr: e.pages, saddr: e.records})
	round1 := bytes.Clone(e.buf)

	e = encoder{}
	e.single(roundBegin(&testHash, 2))
	e.xor(5, a, xorPage(new0, old0))
	e.xor(5, a+PageSize, xorPage(new1, old1))
	e.flush()
	e.single(record{typ: recEnd, addr: e.pages, saddr: e.records})
	round2 := bytes.Clone(e.buf)

	recs := decodeAll(t, round2)
	if len(recs) != 3 || recs[1].typ != recXor || recs[1].count != 2 {
		t.Fatalf("round 2 decodes to %v, want begin, one XOR run of 2 pages, end", recs)
	}
	if x := recs[1].data; x[17] != 0xfe || x[PageSize+4095] != 2 || bytes.Count(x, []byte{0}) != 2*PageSize-2 {
		t.Fatal("the XOR record does not carry the pages' difference")
	}

	s, err := NewStore(filepath.Join(shmDir(t), "store"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, in := range [][]byte{round1, round2} {
		var st RoundStats
		if err := s.applyRound(newDecoder(bytes.NewReader(in)), &st); err != errStreamDone {
			t.Fatalf("apply: %v", err)
		}
		if st.Round == 2 && (st.DataPages != 2 || st.XorPages != 2) {
			t.Fatalf("round 2 counted %d data pages, %d XOR; want 2, 2", st.DataPages, st.XorPages)
		}
	}
	got := make([]byte, 2*PageSize)
	if err := s.read(5, a, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[:PageSize], new0) || !bytes.Equal(got[PageSize:], new1) {
		t.Fatal("the store does not hold the new pages")
	}

	// An XOR for a process the store holds nothing of is corrupt.
	e = encoder{}
	e.single(roundBegin(&testHash, 3))
	e.xor(6, a, xorPage(new0, old0))
	e.flush()
	e.single(record{typ: recEnd, addr: e.pages, saddr: e.records})
	var st RoundStats
	if err := s.applyRound(newDecoder(bytes.NewReader(e.buf)), &st); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("XOR onto an unknown pid: %v", err)
	}
}

// TestRoundStreamValid: the fuzz targets' seed is a complete round.
func TestRoundStreamValid(t *testing.T) {
	s, err := NewStore(filepath.Join(shmDir(t), "store"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var st RoundStats
	if err := s.applyRound(newDecoder(bytes.NewReader(roundStream())), &st); err != errStreamDone {
		t.Fatalf("apply the seed round: %v", err)
	}
	if st.XorPages != 1 || st.DataPages != 3 || st.ZeroPages != 1 || st.CopyPages != 1 {
		t.Fatalf("seed round counted %+v", st)
	}
	// The store hashed what it stored under the round's key: the page
	// data wrote, the one copied, the one XORed, and the one zeroed.
	page := bytes.Repeat([]byte{7}, PageSize)
	other := bytes.Clone(page)
	other[100] = 9
	for _, c := range []struct {
		pid  uint32
		addr uint64
		want []byte
	}{{1, 0x10000, page}, {2, 0x30000, page}, {1, 0x11000, other}, {1, 0x20000, zeroPage[:]}} {
		sums, err := s.sumsAt(nil, c.pid, c.addr, 1)
		if err != nil || len(sums) != 1 || sums[0] != testHash.sum(c.want) {
			t.Errorf("pid %d %#x: hashes %v (%v), want that of its page", c.pid, c.addr, sums, err)
		}
	}
	// A later round under another key is corrupt.
	other2 := newPageHasher()
	var e encoder
	e.single(roundBegin(&other2, 2))
	e.single(record{typ: recEnd, addr: 0, saddr: 1})
	if err := s.applyRound(newDecoder(bytes.NewReader(e.buf)), &st); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a round under another key: %v, want ErrCorrupt", err)
	}
}
