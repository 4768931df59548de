package blockdiff

import (
	"bytes"
	"encoding/json"
	"io"
	"math/rand/v2"
	"testing"
)

// memFile is a File in memory.
type memFile struct{ b []byte }

func (f *memFile) WriteAt(p []byte, off int64) (int, error) {
	if end := int(off) + len(p); end > len(f.b) {
		f.b = append(f.b, make([]byte, end-len(f.b))...)
	}
	return copy(f.b[off:], p), nil
}

func (f *memFile) Truncate(n int64) error {
	if int(n) <= len(f.b) {
		f.b = f.b[:n]
	} else {
		f.b = append(f.b, make([]byte, int(n)-len(f.b))...)
	}
	return nil
}

// roundTrip records old as sent through w's chunks, diffs cur against it
// and applies the patch to a copy of old.
func roundTrip(t *testing.T, old, cur []byte, chunk int) Patch {
	t.Helper()
	x := NewIndex()
	w := x.Writer("f", int64(max(len(old), MinSize)))
	for b := old; len(b) > 0; {
		n := min(chunk, len(b))
		if _, err := w.Write(b[:n]); err != nil {
			t.Fatal(err)
		}
		b = b[n:]
	}
	p, ok, err := x.Diff("f", bytes.NewReader(cur))
	if err != nil || !ok {
		t.Fatalf("diff: %v %v", ok, err)
	}
	if err := p.Check(int64(len(cur))); err != nil {
		t.Fatalf("a patch of Diff fails its check: %v", err)
	}
	var data []byte
	for _, r := range p.Ranges {
		data = append(data, cur[r.Off:r.Off+r.Len]...)
	}
	f := &memFile{b: bytes.Clone(old)}
	if err := Apply(f, p, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(f.b, cur) {
		t.Fatalf("patched copy differs (%d bytes, want %d)", len(f.b), len(cur))
	}
	return p
}

func TestDiff(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	base := make([]byte, 3*BlockSize+100)
	for i := range base {
		base[i] = byte(rng.IntN(256))
	}
	edit := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(base)) }
	for _, tc := range []struct {
		name string
		cur  []byte
		data int64
	}{
		{"same", base, 0},
		{"one byte", edit(func(b []byte) []byte { b[BlockSize+5] ^= 1; return b }), BlockSize},
		{"two apart", edit(func(b []byte) []byte { b[0] ^= 1; b[2*BlockSize] ^= 1; return b }), 2 * BlockSize},
		{"two touching", edit(func(b []byte) []byte { b[BlockSize] ^= 1; b[2*BlockSize] ^= 1; return b }), 2 * BlockSize},
		{"tail", edit(func(b []byte) []byte { b[len(b)-1] ^= 1; return b }), 100},
		{"grown", edit(func(b []byte) []byte { return append(b, 1, 2, 3) }), 103},
		{"cut", edit(func(b []byte) []byte { return b[:2*BlockSize+7] }), 7},
		{"cut to a block", edit(func(b []byte) []byte { return b[:BlockSize] }), 0},
		{"empty", nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, chunk := range []int{1000, BlockSize, 3 * BlockSize / 2, 1 << 20} {
				p := roundTrip(t, base, tc.cur, chunk)
				if p.DataLen() != tc.data || p.Size != int64(len(tc.cur)) {
					t.Fatalf("chunk %d: patch %+v (%d bytes of data), want %d", chunk, p, p.DataLen(), tc.data)
				}
			}
		})
	}
}

func TestIndex(t *testing.T) {
	x := NewIndex()
	if w := x.Writer("small", MinSize-1); w != nil {
		t.Error("a small file indexed")
	}
	if _, ok, _ := x.Diff("small", bytes.NewReader(nil)); ok {
		t.Error("a diff of a file never recorded")
	}
	_, _ = x.Writer("f", MinSize).Write([]byte("abc"))
	x.Forget("f")
	if _, ok, _ := x.Diff("f", bytes.NewReader(nil)); ok {
		t.Error("a diff of a forgotten file")
	}
	var nilIndex *Index
	if nilIndex.Writer("f", MinSize) != nil {
		t.Error("a nil index records")
	}
	// Another index (another seed) knows nothing of this one's files.
	y := NewIndex()
	_, _ = y.Writer("f", MinSize).Write(bytes.Repeat([]byte{1}, BlockSize))
	p, _, _ := y.Diff("f", bytes.NewReader(bytes.Repeat([]byte{1}, BlockSize)))
	if p.DataLen() != 0 {
		t.Errorf("an unchanged block: %+v", p)
	}
}

func TestCheck(t *testing.T) {
	for _, p := range []Patch{
		{Path: "", Size: 1},
		{Path: "/abs", Size: 1},
		{Path: "../up", Size: 1},
		{Path: "..", Size: 1},
		{Path: ".", Size: 1},
		{Path: "a/../../b", Size: 1},
		{Path: "a//b", Size: 1},
		{Path: "a", Size: -1},
		{Path: "a", Size: 101},
		{Path: "a", Size: 10, Ranges: []Range{{0, 0}}},
		{Path: "a", Size: 10, Ranges: []Range{{-1, 2}}},
		{Path: "a", Size: 10, Ranges: []Range{{5, 6}}},
		{Path: "a", Size: 10, Ranges: []Range{{4, 2}, {5, 1}}},
		{Path: "a", Size: 10, Ranges: []Range{{4, 2}, {1, 1}}},
		{Path: "a", Size: 100, Ranges: []Range{{1 << 62, 1 << 62}}},
	} {
		if err := p.Check(100); err == nil {
			t.Errorf("%+v passed", p)
		}
	}
	if err := (Patch{Path: "a/b", Size: 10, Ranges: []Range{{0, 2}, {2, 3}, {9, 1}}}).Check(100); err != nil {
		t.Error(err)
	}
}

func TestApplyShortData(t *testing.T) {
	f := &memFile{b: make([]byte, 10)}
	err := Apply(f, Patch{Path: "a", Size: 10, Ranges: []Range{{2, 4}}}, bytes.NewReader([]byte{1, 2}))
	if err == nil {
		t.Fatal("a patch applied from short data")
	}
}

// FuzzPatch: a patch a peer sends either fails its check, or applies
// within its size from exactly its data's length.
func FuzzPatch(f *testing.F) {
	f.Add([]byte(`{"path":"a","size":10,"ranges":[{"off":2,"len":3}]}`), []byte("0123456789"))
	f.Add([]byte(`{"path":"../a","size":10}`), []byte{})
	f.Add([]byte(`{"path":"a","size":4,"ranges":[{"off":3,"len":9223372036854775807}]}`), []byte{})
	f.Fuzz(func(t *testing.T, msg, old []byte) {
		var p Patch
		if json.Unmarshal(msg, &p) != nil {
			return
		}
		const limit = 1 << 16
		if p.Check(limit) != nil {
			return
		}
		file := &memFile{b: bytes.Clone(old)}
		data := bytes.Repeat([]byte{0xee}, int(p.DataLen()))
		r := bytes.NewReader(data)
		if err := Apply(file, p, r); err != nil {
			t.Fatalf("a checked patch failed: %v", err)
		}
		if int64(len(file.b)) != p.Size || r.Len() != 0 {
			t.Fatalf("size %d (want %d), %d bytes of data left", len(file.b), p.Size, r.Len())
		}
		if _, err := io.ReadAll(r); err != nil {
			t.Fatal(err)
		}
	})
}

// FuzzDiff: whatever a file was and became, its patch turns the first
// into the second.
func FuzzDiff(f *testing.F) {
	f.Add([]byte("abc"), []byte("abd"), uint16(1))
	f.Fuzz(func(t *testing.T, old, cur []byte, chunk uint16) {
		roundTrip(t, old, cur, int(chunk)+1)
	})
}
