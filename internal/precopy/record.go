package precopy

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/cespare/xxhash/v2"
)

// PageSize is the page size this package works with (x86-64, arm64 with
// 4 KiB pages); NewSource refuses other machines.
const PageSize = 4096

// A stream (one round, or the final delta) is a sequence of records:
//
//	offset size
//	0      1    type
//	1      3    zero
//	4      4    count: pages (begin: protocol version)
//	8      4    pid: namespace pid of the pages' own address (0: none)
//	12     4    spid: namespace pid of a copy's source (round begin:
//	            sequence)
//	16     8    addr: the pages' own address (begin: page hash seed,
//	            first half; file begin: pages image id; file end:
//	            digest; end: pages)
//	24     8    saddr: address of a copy's source (begin: page hash
//	            seed, second half; end: records)
//	32     count·4096 bytes of data, data and XOR records only
//	…      8    xxhash64 of the header and the data
//
// all little-endian. A round is begin, then data, zero and copy records,
// then end. A final delta is begin, then per pages image a file begin,
// its pages in the image's order as held, copy, data, XOR and zero
// records, and a file end; then end. Rounds carry XOR records too.
const (
	headerLen   = 32
	checksumLen = 8
	// maxDataPages bounds a data record (and the decoder's buffer).
	maxDataPages = 256
	// maxRunPages bounds records without data.
	maxRunPages = 1 << 20
	// maxAddr bounds addresses: the store files are this big (sparse).
	maxAddr = 1 << 57
	// version 2: pages are hashed under a key (pageHasher) whose seed
	// the final delta's begin record carries; 3: XOR records; 4: every
	// round's begin record carries the seed too (the destination hashes
	// what it stores).
	version = 4
)

// Record types.
const (
	recBegin   byte = 'B'
	recData    byte = 'D' // count pages of data for (pid, addr)
	recZero    byte = 'Z' // count zero pages at (pid, addr)
	recCopy    byte = 'C' // (pid, addr) gets the content held at (spid, saddr)
	recXor     byte = 'X' // count pages of data XORed with what (pid, addr) holds
	recHeld    byte = 'H' // final only: the destination holds (pid, addr)
	recFile    byte = 'F' // final only: pages image addr begins, count pages
	recFileEnd byte = 'f' // final only: its digest (addr) and pages (count)
	recEnd     byte = 'E'
)

// Stream kinds in a begin record's pid field.
const (
	kindRound = 1
	kindFinal = 2
)

// ErrCorrupt means a stream does not decode: a bad checksum, an unknown or
// misplaced record, or counts that disagree.
var ErrCorrupt = errors.New("precopy: corrupt stream")

// record is one decoded record. Data aliases the decoder's buffer.
type record struct {
	typ         byte
	count       uint32
	pid, spid   uint32
	addr, saddr uint64
	data        []byte
}

func (r record) String() string {
	return fmt.Sprintf("%c count=%d pid=%d addr=%#x spid=%d saddr=%#x", r.typ, r.count, r.pid, r.addr, r.spid, r.saddr)
}

func putHeader(b []byte, r record) {
	b[0] = r.typ
	b[1], b[2], b[3] = 0, 0, 0
	binary.LittleEndian.PutUint32(b[4:], r.count)
	binary.LittleEndian.PutUint32(b[8:], r.pid)
	binary.LittleEndian.PutUint32(b[12:], r.spid)
	binary.LittleEndian.PutUint64(b[16:], r.addr)
	binary.LittleEndian.PutUint64(b[24:], r.saddr)
}

// encoder builds records into buf, merging consecutive pages of the same
// kind into one record (a run). Not safe for concurrent use.
type encoder struct {
	buf []byte
	// The open run: start of its header in buf, and what it is.
	open  bool
	start int
	run   record
	// Records counts closed records, pages the pages they carry.
	records, pages uint64
}

// flush closes the open run: writes its header and checksum.
func (e *encoder) flush() {
	if !e.open {
		return
	}
	putHeader(e.buf[e.start:], e.run)
	sum := xxhash.Sum64(e.buf[e.start:])
	e.buf = binary.LittleEndian.AppendUint64(e.buf, sum)
	e.open = false
	e.records++
	if isPages(e.run.typ) {
		e.pages += uint64(e.run.count)
	}
}

// isPages reports whether records of type t carry pages.
func isPages(t byte) bool {
	return t == recData || t == recZero || t == recCopy || t == recHeld || t == recXor
}

// hasData reports whether records of type t carry count pages of data.
func hasData(t byte) bool { return t == recData || t == recXor }

// single writes a record without pages (begin, file begin and end, end).
func (e *encoder) single(r record) {
	e.flush()
	e.start = len(e.buf)
	e.buf = append(e.buf, make([]byte, headerLen)...)
	e.run, e.open = r, true
	e.flush()
}

// page adds one page of type typ at (pid, addr); data is the page for
// recData, (spid, saddr) the source for recCopy.
func (e *encoder) page(typ byte, pid uint32, addr uint64, spid uint32, saddr uint64, data []byte) {
	e.extend(typ, pid, addr, spid, saddr)
	if typ == recData {
		e.buf = append(e.buf, data...)
	}
}

// xor adds one recXor page at (pid, addr): x is the page XOR what the
// destination holds there (xorIfWorth).
func (e *encoder) xor(pid uint32, addr uint64, x []byte) {
	e.extend(recXor, pid, addr, 0, 0)
	e.buf = append(e.buf, x...)
}

// xorInto sets dst to dst XOR src (of the same length, a multiple of 8).
func xorInto(dst, src []byte) {
	for i := 0; i+8 <= len(dst); i += 8 {
		binary.LittleEndian.PutUint64(dst[i:], binary.LittleEndian.Uint64(dst[i:])^binary.LittleEndian.Uint64(src[i:]))
	}
}

// extend adds one page of type typ to the open run, or opens a new run.
func (e *encoder) extend(typ byte, pid uint32, addr uint64, spid uint32, saddr uint64) {
	r := &e.run
	if e.open && r.typ == typ && r.pid == pid && (pid == 0 || addr == r.addr+uint64(r.count)*PageSize) &&
		(typ != recCopy || (spid == r.spid && saddr == r.saddr+uint64(r.count)*PageSize)) &&
		((hasData(typ) && r.count < maxDataPages) || (!hasData(typ) && r.count < maxRunPages)) {
		r.count++
	} else {
		e.flush()
		e.start = len(e.buf)
		e.buf = append(e.buf, make([]byte, headerLen)...)
		e.run = record{typ: typ, count: 1, pid: pid, addr: addr, spid: spid, saddr: saddr}
		e.open = true
	}
}

// decoder reads records from a stream. Not safe for concurrent use.
type decoder struct {
	r    *bufio.Reader
	hdr  [headerLen]byte
	data []byte
}

func newDecoder(r io.Reader) *decoder {
	return &decoder{r: bufio.NewReaderSize(r, 1<<20)}
}

// next reads one record. A stream that ends between records gives io.EOF.
func (d *decoder) next() (record, error) {
	if _, err := io.ReadFull(d.r, d.hdr[:]); err != nil {
		if err == io.ErrUnexpectedEOF {
			return record{}, fmt.Errorf("%w: truncated record header", ErrCorrupt)
		}
		return record{}, err
	}
	h := d.hdr[:]
	r := record{
		typ:   h[0],
		count: binary.LittleEndian.Uint32(h[4:]),
		pid:   binary.LittleEndian.Uint32(h[8:]),
		spid:  binary.LittleEndian.Uint32(h[12:]),
		addr:  binary.LittleEndian.Uint64(h[16:]),
		saddr: binary.LittleEndian.Uint64(h[24:]),
	}
	if h[1]|h[2]|h[3] != 0 {
		return r, fmt.Errorf("%w: reserved header bytes set", ErrCorrupt)
	}
	n := 0
	if hasData(r.typ) {
		if r.count > maxDataPages {
			return r, fmt.Errorf("%w: data record of %d pages", ErrCorrupt, r.count)
		}
		n = int(r.count) * PageSize
	}
	if cap(d.data) < n {
		d.data = make([]byte, maxDataPages*PageSize)
	}
	r.data = d.data[:n]
	if _, err := io.ReadFull(d.r, r.data); err != nil {
		return r, fmt.Errorf("%w: truncated %c record: %v", ErrCorrupt, r.typ, err)
	}
	var sb [checksumLen]byte
	if _, err := io.ReadFull(d.r, sb[:]); err != nil {
		return r, fmt.Errorf("%w: truncated %c record: %v", ErrCorrupt, r.typ, err)
	}
	h64 := xxhash.New()
	h64.Write(d.hdr[:])
	h64.Write(r.data)
	if got, want := h64.Sum64(), binary.LittleEndian.Uint64(sb[:]); got != want {
		return r, fmt.Errorf("%w: %v: checksum %016x, want %016x", ErrCorrupt, r, got, want)
	}
	return r, r.check()
}

// check validates a record's fields for its type (not its place).
func (r record) check() error {
	bad := func(why string) error { return fmt.Errorf("%w: %v: %s", ErrCorrupt, r, why) }
	switch {
	case r.typ == recBegin || r.typ == recFile || r.typ == recFileEnd || r.typ == recEnd:
		return nil
	case !isPages(r.typ):
		return bad("unknown type")
	}
	if r.count == 0 || r.count > maxRunPages {
		return bad("bad page count")
	}
	span := uint64(r.count) * PageSize
	if r.pid != 0 && (r.addr%PageSize != 0 || r.addr >= maxAddr || maxAddr-r.addr < span) {
		return bad("address outside the store")
	}
	if r.typ == recHeld && r.pid == 0 {
		return bad("held pages without an address")
	}
	if r.typ == recXor && r.pid == 0 {
		return bad("XOR pages without an address (nothing held to apply them to)")
	}
	if r.typ == recCopy && (r.spid == 0 || r.saddr%PageSize != 0 || r.saddr >= maxAddr || maxAddr-r.saddr < span) {
		return bad("copy source outside the store")
	}
	return nil
}
