package precopy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"

	"google.golang.org/protobuf/encoding/protowire"
	"testing"
)

// roundStream encodes a small valid round: data, zero, copy and XOR runs.
func roundStream() []byte {
	var e encoder
	e.single(record{typ: recBegin, pid: kindRound, count: version, addr: 1})
	page := bytes.Repeat([]byte{7}, PageSize)
	e.page(recData, 1, 0x10000, 0, 0, page)
	e.page(recData, 1, 0x11000, 0, 0, page)
	e.page(recZero, 1, 0x20000, 0, 0, nil)
	e.page(recCopy, 2, 0x30000, 1, 0x10000, nil)
	other := bytes.Clone(page)
	other[100] = 9
	e.xor(1, 0x11000, other, page)
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

// FuzzPagemap decodes arbitrary pagemap images: runs it returns are
// aligned, non-empty and inside the address space.
func FuzzPagemap(f *testing.F) {
	img := binary.LittleEndian.AppendUint32(nil, imgCommonMagic)
	img = binary.LittleEndian.AppendUint32(img, pagemapMagic)
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
