package precopy

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

// page returns a page filled with b.
func pageOf(b byte) []byte { return bytes.Repeat([]byte{b}, PageSize) }

type pageCall struct {
	typ   byte
	pid   uint32
	addr  uint64
	spid  uint32
	saddr uint64
	fill  byte // data pages only
}

// decodeAll reads every record of buf.
func decodeAll(t *testing.T, buf []byte) []record {
	t.Helper()
	d := newDecoder(bytes.NewReader(buf))
	var out []record
	for {
		r, err := d.next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("decode: %v", err)
		}
		r.data = bytes.Clone(r.data)
		out = append(out, r)
	}
}

func TestEncoderRuns(t *testing.T) {
	const a = 0x7f0000000000
	tests := []struct {
		name  string
		calls []pageCall
		want  []record // data not compared here
	}{
		{"contiguous data merges", []pageCall{
			{recData, 1, a, 0, 0, 1}, {recData, 1, a + PageSize, 0, 0, 2}, {recData, 1, a + 2*PageSize, 0, 0, 3},
		}, []record{{typ: recData, count: 3, pid: 1, addr: a}}},
		{"gap splits", []pageCall{
			{recData, 1, a, 0, 0, 1}, {recData, 1, a + 2*PageSize, 0, 0, 2},
		}, []record{{typ: recData, count: 1, pid: 1, addr: a}, {typ: recData, count: 1, pid: 1, addr: a + 2*PageSize}}},
		{"pid splits", []pageCall{
			{recZero, 1, a, 0, 0, 0}, {recZero, 2, a + PageSize, 0, 0, 0},
		}, []record{{typ: recZero, count: 1, pid: 1, addr: a}, {typ: recZero, count: 1, pid: 2, addr: a + PageSize}}},
		{"type splits", []pageCall{
			{recZero, 1, a, 0, 0, 0}, {recData, 1, a + PageSize, 0, 0, 9}, {recHeld, 1, a + 2*PageSize, 0, 0, 0},
		}, []record{{typ: recZero, count: 1, pid: 1, addr: a}, {typ: recData, count: 1, pid: 1, addr: a + PageSize}, {typ: recHeld, count: 1, pid: 1, addr: a + 2*PageSize}}},
		{"copies merge only with a contiguous source", []pageCall{
			{recCopy, 1, a, 2, 0x1000, 0}, {recCopy, 1, a + PageSize, 2, 0x2000, 0}, {recCopy, 1, a + 2*PageSize, 2, 0x2000, 0},
		}, []record{{typ: recCopy, count: 2, pid: 1, addr: a, spid: 2, saddr: 0x1000}, {typ: recCopy, count: 1, pid: 1, addr: a + 2*PageSize, spid: 2, saddr: 0x2000}}},
		{"pages without an address merge", []pageCall{
			{recData, 0, 0, 0, 0, 1}, {recData, 0, 0, 0, 0, 2},
		}, []record{{typ: recData, count: 2}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var e encoder
			for _, c := range tt.calls {
				var data []byte
				if c.typ == recData {
					data = pageOf(c.fill)
				}
				e.page(c.typ, c.pid, c.addr, c.spid, c.saddr, data)
			}
			e.flush()
			got := decodeAll(t, e.buf)
			if len(got) != len(tt.want) {
				t.Fatalf("got %d records %v, want %v", len(got), got, tt.want)
			}
			var fills []byte
			for _, c := range tt.calls {
				if c.typ == recData {
					fills = append(fills, c.fill)
				}
			}
			for i, w := range tt.want {
				g := got[i]
				if g.typ != w.typ || g.count != w.count || g.pid != w.pid || g.addr != w.addr || g.spid != w.spid || g.saddr != w.saddr {
					t.Errorf("record %d = %v, want %v", i, g, w)
				}
				for k := 0; k < len(g.data)/PageSize; k++ {
					if !bytes.Equal(g.data[k*PageSize:(k+1)*PageSize], pageOf(fills[0])) {
						t.Errorf("record %d page %d has the wrong data", i, k)
					}
					fills = fills[1:]
				}
			}
			if e.records != uint64(len(tt.want)) || e.pages != uint64(len(tt.calls)) {
				t.Errorf("encoder counted %d records, %d pages; want %d, %d", e.records, e.pages, len(tt.want), len(tt.calls))
			}
		})
	}
}

func TestEncoderRunLimit(t *testing.T) {
	var e encoder
	for i := 0; i < maxDataPages+1; i++ {
		e.page(recData, 1, uint64(i)*PageSize, 0, 0, zeroPage[:])
	}
	e.flush()
	got := decodeAll(t, e.buf)
	if len(got) != 2 || got[0].count != maxDataPages || got[1].count != 1 {
		t.Fatalf("got %v, want a full data record and one of a single page", got)
	}
}

func TestDecoderDetectsDamage(t *testing.T) {
	var e encoder
	e.single(roundBegin(&testHash, 1))
	e.page(recData, 7, 0x10000, 0, 0, pageOf(0xab))
	e.page(recData, 7, 0x11000, 0, 0, pageOf(0xcd))
	e.flush()
	e.single(record{typ: recEnd, addr: 2, saddr: 2})
	good := bytes.Clone(e.buf)
	if n := len(decodeAll(t, good)); n != 3 {
		t.Fatalf("%d records decoded from the intact stream, want 3", n)
	}
	dataRec := headerLen + checksumLen // where the data record starts
	tests := []struct {
		name   string
		mangle func([]byte) []byte
	}{
		{"flipped data bit", func(b []byte) []byte { b[dataRec+headerLen+5000] ^= 1; return b }},
		{"changed address", func(b []byte) []byte { b[dataRec+17] ^= 0x10; return b }},
		{"changed pid", func(b []byte) []byte { b[dataRec+8]++; return b }},
		{"changed checksum", func(b []byte) []byte { b[dataRec+headerLen+2*PageSize] ^= 0xff; return b }},
		{"reserved byte", func(b []byte) []byte { b[dataRec+2] = 1; return b }},
		{"truncated data", func(b []byte) []byte { return b[:dataRec+headerLen+100] }},
		{"truncated header", func(b []byte) []byte { return b[:dataRec+10] }},
		{"oversized data record", func(b []byte) []byte {
			b[dataRec+4], b[dataRec+5] = 0xff, 0xff
			return b
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newDecoder(bytes.NewReader(tt.mangle(bytes.Clone(good))))
			var err error
			for err == nil {
				_, err = d.next()
			}
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("got %v, want ErrCorrupt", err)
			}
		})
	}
}

func TestRecordCheck(t *testing.T) {
	tests := []struct {
		r  record
		ok bool
	}{
		{record{typ: recData, count: 1, pid: 1, addr: 0x1000}, true},
		{record{typ: recData, count: 0, pid: 1, addr: 0x1000}, false},
		{record{typ: recZero, count: 1, pid: 1, addr: 0x1001}, false},
		{record{typ: recZero, count: 2, pid: 1, addr: maxAddr - PageSize}, false},
		{record{typ: recZero, count: 1, pid: 1, addr: maxAddr - PageSize}, true},
		{record{typ: recHeld, count: 1, pid: 0, addr: 0}, false},
		{record{typ: recXor, count: 1, pid: 0, addr: 0}, false},
		{record{typ: recXor, count: 1, pid: 1, addr: 0x1000}, true},
		{record{typ: recData, count: 1, pid: 0, addr: 0}, true},
		{record{typ: recCopy, count: 1, pid: 1, addr: 0x1000, spid: 0, saddr: 0x2000}, false},
		{record{typ: recCopy, count: 1, pid: 1, addr: 0x1000, spid: 2, saddr: 0x2008}, false},
		{record{typ: recCopy, count: 1, pid: 1, addr: 0x1000, spid: 2, saddr: 0x2000}, true},
		{record{typ: 'X'}, false},
	}
	for _, tt := range tests {
		err := tt.r.check()
		if (err == nil) != tt.ok {
			t.Errorf("%v: check = %v, want ok=%v", tt.r, err, tt.ok)
		}
		if err != nil && !errors.Is(err, ErrCorrupt) {
			t.Errorf("%v: %v is not ErrCorrupt", tt.r, err)
		}
	}
}
