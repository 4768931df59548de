package precopy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/transfer"
)

// Store is the destination's copy of the source's memory: one sparse file
// per namespace pid in its directory, the page at address a stored at
// offset a, so holes cost nothing and no index is kept. The directory
// must be on a file system that allows files of 2^57 bytes (tmpfs, as
// the agents' scratch space is; ext4 does not). It is not safe for
// concurrent use.
type Store struct {
	dir   string
	log   *slog.Logger
	files map[uint32]*os.File
	buf   []byte

	// hash is the source's page hasher, from the first round's begin
	// record (keyed false before); sums holds, by pid and page number,
	// the hash of each page stored (a page not there reads as zeros:
	// zeroSum), so that the final delta's digest covers the pages left
	// in the store without reading them.
	hash    pageHasher
	keyed   bool
	sums    map[uint32]map[uint64]uint64
	zeroSum uint64

	// maxBytes, when positive, bounds each stream received (SetMaxBytes).
	maxBytes int64
}

// SetMaxBytes bounds each stream the store receives (a round, the final
// delta, the final images) to n bytes of content: past it the receive
// fails with transfer.ErrTooLarge, naming the bound, before more reaches
// the disk. 0, the default, is no bound; a destination sets one derived
// from what the source declared (agent.stateLimit).
func (s *Store) SetMaxBytes(n int64) { s.maxBytes = n }

// NewStore creates the store's directory dir, which must not exist, and
// checks that its file system can hold the sparse files (ErrNotSupported
// otherwise). log may be nil.
func NewStore(dir string, log *slog.Logger) (*Store, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("precopy store: %w", err)
	}
	probe := filepath.Join(dir, "probe")
	f, err := os.Create(probe)
	if err == nil {
		err = f.Truncate(maxAddr)
		f.Close()
		err = errors.Join(err, os.Remove(probe))
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("%w: store %s cannot hold sparse files of 2^57 bytes (use tmpfs): %v", ErrNotSupported, dir, err)
	}
	return &Store{dir: dir, log: log, files: map[uint32]*os.File{}, buf: make([]byte, maxDataPages*PageSize), sums: map[uint32]map[uint64]uint64{}}, nil
}

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

// Close closes the store's files and removes its directory.
func (s *Store) Close() error {
	var errs []error
	for _, f := range s.files {
		errs = append(errs, f.Close())
	}
	s.files = nil
	errs = append(errs, os.RemoveAll(s.dir))
	return errors.Join(errs...)
}

// StoredBytes is the space the store's files take (pages held, holes
// excluded).
func (s *Store) StoredBytes() (int64, error) {
	var n int64
	for _, f := range s.files {
		fi, err := f.Stat()
		if err != nil {
			return n, err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			n += st.Blocks * 512
		}
	}
	return n, nil
}

// maxStoreFiles bounds the processes a store holds pages of (a file
// each): a peer cannot make the destination create files without end.
const maxStoreFiles = 1 << 15

// file returns the store file of pid, creating it if create is set (an
// unknown pid otherwise is a corrupt stream).
func (s *Store) file(pid uint32, create bool) (*os.File, error) {
	if f, ok := s.files[pid]; ok {
		return f, nil
	}
	if !create {
		return nil, fmt.Errorf("%w: no pages of pid %d", ErrCorrupt, pid)
	}
	if len(s.files) >= maxStoreFiles {
		return nil, fmt.Errorf("%w: pages of more than %d processes", ErrCorrupt, maxStoreFiles)
	}
	f, err := os.OpenFile(filepath.Join(s.dir, strconv.FormatUint(uint64(pid), 10)), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	if err := f.Truncate(maxAddr); err != nil {
		f.Close()
		return nil, err
	}
	s.files[pid] = f
	return f, nil
}

// receive reads one stream from conn through apply, which decodes it
// from a pipe on its own goroutine.
func (s *Store) receive(ctx context.Context, conn *transfer.Conn, apply func(*decoder) error) (transfer.Stats, error) {
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		// apply returns errStreamDone after reading the end of the pipe,
		// or the reason it stopped early, which fails RecvStream's next
		// write.
		err := apply(newDecoder(pr))
		pr.CloseWithError(err)
		done <- err
	}()
	st, rerr := conn.RecvStream(ctx, pw, transfer.RecvOptions{MaxBytes: s.maxBytes})
	pw.CloseWithError(rerr)
	aerr := <-done
	if rerr != nil {
		return st, rerr
	}
	if errors.Is(aerr, errStreamDone) {
		return st, nil
	}
	return st, aerr
}

// errStreamDone is how apply functions report a complete stream.
var errStreamDone = errors.New("precopy: stream complete")

// expectEnd checks that the stream ends right after its end record.
func expectEnd(d *decoder) error {
	if _, err := d.next(); err != io.EOF {
		if err == nil {
			return fmt.Errorf("%w: records after the end record", ErrCorrupt)
		}
		return err
	}
	return errStreamDone
}

// readBegin reads and checks a stream's begin record.
func readBegin(d *decoder, kind uint32) (record, error) {
	r, err := d.next()
	if err != nil {
		return r, eofCorrupt(err)
	}
	if r.typ != recBegin || r.pid != kind {
		return r, fmt.Errorf("%w: stream starts with %v, want begin of kind %d", ErrCorrupt, r, kind)
	}
	if r.count != version {
		return r, fmt.Errorf("%w: the source speaks pre-copy protocol version %d, this agent %d (run one edgehop version on both nodes)", ErrCorrupt, r.count, version)
	}
	return r, nil
}

func eofCorrupt(err error) error {
	if err == io.EOF {
		return fmt.Errorf("%w: stream ends before its end record", ErrCorrupt)
	}
	return err
}

// ReceiveRound receives one round sent by Source.Round into the store.
// On error the store's content is unknown (the source's Round fails too,
// and the migration falls back to a full transfer).
func (s *Store) ReceiveRound(ctx context.Context, conn *transfer.Conn) (RoundStats, error) {
	var st RoundStats
	start := time.Now()
	tst, err := s.receive(ctx, conn, func(d *decoder) error { return s.applyRound(d, &st) })
	st.Bytes, st.Duration = tst.WireBytes, time.Since(start)
	if err != nil {
		return st, fmt.Errorf("precopy receive round: %w", err)
	}
	return st, nil
}

func (s *Store) applyRound(d *decoder, st *RoundStats) error {
	b, err := readBegin(d, kindRound)
	if err != nil {
		return err
	}
	st.Round = int(b.spid)
	if !s.key(seedOf(b.addr, b.saddr)) {
		return fmt.Errorf("%w: round %d is hashed under another key than the rounds before", ErrCorrupt, st.Round)
	}
	var records, pages uint64
	for {
		r, err := d.next()
		if err != nil {
			return eofCorrupt(err)
		}
		if r.typ != recEnd && r.pid == 0 {
			return fmt.Errorf("%w: %v in a round has no address", ErrCorrupt, r)
		}
		switch r.typ {
		case recData:
			st.DataPages += int64(r.count)
			err = s.write(r.pid, r.addr, r.data)
		case recXor:
			st.DataPages += int64(r.count)
			st.XorPages += int64(r.count)
			err = s.xor(r)
		case recZero:
			st.ZeroPages += int64(r.count)
			err = s.punch(r.pid, r.addr, r.count)
		case recCopy:
			st.CopyPages += int64(r.count)
			err = s.copy(r)
		case recEnd:
			if r.addr != pages || r.saddr != records+1 {
				return fmt.Errorf("%w: end record says %d pages in %d records, got %d in %d", ErrCorrupt, r.addr, r.saddr, pages, records+1)
			}
			st.Changed = int64(pages)
			return expectEnd(d)
		default:
			return fmt.Errorf("%w: %v in a round", ErrCorrupt, r)
		}
		if err != nil {
			return err
		}
		records++
		pages += uint64(r.count)
	}
}

// key takes the page hasher's seed from a round's begin record: the
// first round's sets it, and a later round must name the same (false
// otherwise).
func (s *Store) key(seed [16]byte) bool {
	if !s.keyed {
		s.hash, s.keyed = pageHasherOf(seed), true
		s.zeroSum = s.hash.sum(zeroPage[:])
	}
	return seed == s.hash.seed
}

// write stores data (whole pages) at (pid, addr) and the hash of each
// page.
func (s *Store) write(pid uint32, addr uint64, data []byte) error {
	if err := s.writeRaw(pid, addr, data); err != nil {
		return err
	}
	m := s.sumsOf(pid)
	for off := 0; off < len(data); off += PageSize {
		m[(addr+uint64(off))/PageSize] = s.hash.sum(data[off : off+PageSize])
	}
	return nil
}

// writeRaw stores data at (pid, addr), leaving the hashes to the caller.
func (s *Store) writeRaw(pid uint32, addr uint64, data []byte) error {
	f, err := s.file(pid, true)
	if err != nil {
		return err
	}
	_, err = f.WriteAt(data, int64(addr))
	return err
}

func (s *Store) sumsOf(pid uint32) map[uint64]uint64 {
	m, ok := s.sums[pid]
	if !ok {
		m = map[uint64]uint64{}
		s.sums[pid] = m
	}
	return m
}

func (s *Store) punch(pid uint32, addr uint64, count uint32) error {
	f, err := s.file(pid, true)
	if err != nil {
		return err
	}
	m := s.sumsOf(pid)
	for i := range uint64(count) {
		delete(m, addr/PageSize+i)
	}
	return linux.PunchHole(f, int64(addr), int64(count)*PageSize)
}

// sumsAt appends to dst the hashes of the count pages stored at (pid,
// addr): what they hashed to when written (zeroSum where none was).
func (s *Store) sumsAt(dst []uint64, pid uint32, addr uint64, count uint32) ([]uint64, error) {
	if _, err := s.file(pid, false); err != nil {
		return dst, err
	}
	m := s.sums[pid]
	for i := range uint64(count) {
		h, ok := m[addr/PageSize+i]
		if !ok {
			h = s.zeroSum
		}
		dst = append(dst, h)
	}
	return dst, nil
}

// read reads n bytes held at (pid, addr) into buf.
func (s *Store) read(pid uint32, addr uint64, buf []byte) error {
	f, err := s.file(pid, false)
	if err != nil {
		return err
	}
	_, err = f.ReadAt(buf, int64(addr))
	return err
}

// xor applies an XOR record: each page held at its address becomes
// itself XOR the record's data.
func (s *Store) xor(r record) error {
	buf := s.buf[:len(r.data)]
	if err := s.read(r.pid, r.addr, buf); err != nil {
		return err
	}
	xorInto(buf, r.data)
	return s.write(r.pid, r.addr, buf)
}

// copy applies a copy record within the store. The source had each page
// in mind as it was after the run's earlier pages were copied, so
// overlapping ranges are copied page by page.
func (s *Store) copy(r record) error {
	n := uint64(r.count) * PageSize
	step := uint64(len(s.buf))
	if r.spid == r.pid && r.saddr < r.addr+n && r.addr < r.saddr+n {
		step = PageSize
	}
	for off := uint64(0); off < n; off += step {
		k := min(step, n-off)
		if err := s.read(r.spid, r.saddr+off, s.buf[:k]); err != nil {
			return err
		}
		if err := s.writeRaw(r.pid, r.addr+off, s.buf[:k]); err != nil {
			return err
		}
		from, to := s.sums[r.spid], s.sumsOf(r.pid)
		for i := uint64(0); i < k/PageSize; i++ {
			h, ok := from[(r.saddr+off)/PageSize+i]
			if !ok {
				h = s.zeroSum
			}
			to[(r.addr+off)/PageSize+i] = h
		}
	}
	return nil
}

// RebuildFinal receives what Source.SendFinal sends and writes the
// complete CRIU image directory imgDir (which must not exist) from the
// store and the delta: every image as the source dumped it, byte for
// byte, except that the pages the store holds at their own address stay
// there. CRIU's restore reads them through imgDir/parent, an incremental
// dump's parent made of hard links to the store's files (linkParent):
// the frozen window neither copies them nor releases the store's copies.
// Each pages image's digest is checked over all its pages, those left in
// the store too (ErrMismatch). The pages images are written to imgDir +
// "-pages" while the others have not arrived, and moved in once they
// have. On error nothing is left at either. Memory stays near one copy
// of the state: the store, and the pages that changed since the rounds;
// after RebuildFinal, successful or not, the store is spent and only
// Close remains (imgDir's links keep what the restore needs).
func (s *Store) RebuildFinal(ctx context.Context, conn *transfer.Conn, imgDir string) (st FinalStats, err error) {
	start := time.Now()
	defer func() { st.Duration = time.Since(start) }()
	pagesDir := PagesDir(imgDir)
	if err := os.RemoveAll(pagesDir); err != nil {
		return st, fmt.Errorf("precopy rebuild: %w", err)
	}
	if err := os.Mkdir(pagesDir, 0o700); err != nil {
		return st, fmt.Errorf("precopy rebuild: %w", err)
	}
	defer os.RemoveAll(pagesDir)
	fb := &finalBuilder{s: s, dir: pagesDir, st: &st, kept: map[uint64][]keptRun{}}
	dst, err := s.receive(ctx, conn, fb.apply)
	st.DeltaBytes = dst.WireBytes
	if err != nil {
		return st, fmt.Errorf("precopy rebuild: %w", errors.Join(err, fb.abandon()))
	}
	mst, err := conn.RecvDir(ctx, imgDir, transfer.RecvOptions{MaxBytes: s.maxBytes})
	st.MetaBytes = mst.WireBytes
	if err == nil {
		err = movePages(pagesDir, imgDir)
	}
	if err == nil {
		err = fb.linkParent(imgDir)
	}
	if err != nil {
		return st, fmt.Errorf("precopy rebuild: %w", errors.Join(err, os.RemoveAll(imgDir)))
	}
	s.log.Debug("precopy rebuilt images", "dir", imgDir, "images", st.Images, "pages", st.Pages,
		"held", st.HeldPages, "copy", st.CopyPages, "zero", st.ZeroPages, "data", st.DataPages, "xor", st.XorPages,
		"ms", time.Since(start).Milliseconds())
	return st, nil
}

// PagesDir is where RebuildFinal writes the pages images of imgDir before
// the other images arrive; a destination that gave up removes it.
func PagesDir(imgDir string) string { return imgDir + "-pages" }

// movePages moves every pages image from dir into imgDir, none over an
// image of the same name there.
func movePages(dir, imgDir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		src, dst := filepath.Join(dir, e.Name()), filepath.Join(imgDir, e.Name())
		if err := linux.RenameNoReplace(src, dst); err != nil {
			return fmt.Errorf("%w: pages image %s: %w", ErrCorrupt, e.Name(), err)
		}
	}
	return nil
}

// finalBuilder writes pages images from a final delta.
type finalBuilder struct {
	s   *Store
	dir string
	st  *FinalStats

	// hash is the source's page hasher (its seed is in the begin
	// record), under which the images' digests are taken.
	hash pageHasher

	// The image being written (nil between images).
	w    *imageWriter
	bufs [2][]byte // the writers' buffers, between images
	name string
	want uint32 // pages its begin record announced

	id   uint64   // the image being written
	sums []uint64 // scratch for the hashes of held pages

	// kept are, by pages image id, the runs of its pages left in the
	// store at their own address (linkParent).
	kept map[uint64][]keptRun
}

// keptRun is a run of a pages image's pages left in the store: count
// pages from position pos of the image, which process pid has at addr
// onwards.
type keptRun struct {
	pos   uint64
	pid   uint32
	addr  uint64
	count uint64
}

func (b *finalBuilder) apply(d *decoder) error {
	br, err := readBegin(d, kindFinal)
	if err != nil {
		return err
	}
	b.hash = pageHasherOf(seedOf(br.addr, br.saddr))
	if b.s.keyed && b.hash.seed != b.s.hash.seed {
		return fmt.Errorf("%w: the final delta is hashed under another key than the rounds", ErrCorrupt)
	}
	var records, pages uint64
	for {
		r, err := d.next()
		if err != nil {
			return eofCorrupt(err)
		}
		if isPages(r.typ) && b.w == nil {
			return fmt.Errorf("%w: %v outside a pages image", ErrCorrupt, r)
		}
		switch r.typ {
		case recFile:
			err = b.begin(r)
		case recFileEnd:
			err = b.end(r)
		case recData, recXor, recZero, recCopy, recHeld:
			err = b.pagesOf(r)
			pages += uint64(r.count)
		case recEnd:
			if b.w != nil {
				return fmt.Errorf("%w: end inside pages image %s", ErrCorrupt, b.name)
			}
			if r.addr != pages || r.saddr != records+1 {
				return fmt.Errorf("%w: end record says %d pages in %d records, got %d in %d", ErrCorrupt, r.addr, r.saddr, pages, records+1)
			}
			return expectEnd(d)
		default:
			return fmt.Errorf("%w: %v in a final delta", ErrCorrupt, r)
		}
		if err != nil {
			return err
		}
		records++
	}
}

func (b *finalBuilder) begin(r record) error {
	if b.w != nil {
		return fmt.Errorf("%w: pages image %d begins inside %s", ErrCorrupt, r.addr, b.name)
	}
	b.name = filepath.Join(b.dir, fmt.Sprintf("pages-%d.img", r.addr))
	perm := fs.FileMode(r.spid).Perm()
	f, err := os.OpenFile(b.name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%w: pages image %d sent twice", ErrCorrupt, r.addr)
	}
	if err != nil {
		return err
	}
	if err := f.Chmod(perm); err != nil { // not subject to the umask
		f.Close()
		return err
	}
	b.w, b.want, b.id = newImageWriter(f, b.hash, b.bufs), r.count, r.addr
	b.st.Images++
	return nil
}

func (b *finalBuilder) end(r record) error {
	if b.w == nil {
		return fmt.Errorf("%w: pages image end outside an image", ErrCorrupt)
	}
	w := b.w
	b.w = nil
	err := w.close()
	b.bufs = w.buffers()
	if err != nil {
		return err
	}
	b.st.DumpBytes += int64(w.pages) * PageSize
	if w.pages != b.want || r.count != w.pages {
		return fmt.Errorf("%w: %s has %d pages, announced %d and %d", ErrCorrupt, b.name, w.pages, b.want, r.count)
	}
	if got := w.sum; got != r.addr {
		return fmt.Errorf("%w: %s digest %016x, the dump's %016x", ErrMismatch, b.name, got, r.addr)
	}
	return nil
}

// pagesOf appends a page record's pages to the image being written and
// marks the store's copy at their own address for release.
func (b *finalBuilder) pagesOf(r record) error {
	st, w := b.st, b.w
	if uint64(w.pages)+uint64(r.count) > uint64(b.want) {
		return fmt.Errorf("%w: %s gets more than its %d pages", ErrCorrupt, b.name, b.want)
	}
	st.Pages += int64(r.count)
	switch r.typ {
	case recData:
		st.DataPages += int64(r.count)
		w.write(r.data)
	case recXor:
		st.DataPages += int64(r.count)
		st.XorPages += int64(r.count)
		if err := b.fromStore(r.pid, r.addr, len(r.data), r.data); err != nil {
			return err
		}
	case recZero:
		st.ZeroPages += int64(r.count)
		w.zeros(r.count)
	case recHeld:
		st.HeldPages += int64(r.count)
		if !b.s.keyed {
			return fmt.Errorf("%w: a held page, but no round came", ErrCorrupt)
		}
		b.keep(keptRun{pos: uint64(w.pages), pid: r.pid, addr: r.addr, count: uint64(r.count)})
		var err error
		if b.sums, err = b.s.sumsAt(b.sums[:0], r.pid, r.addr, r.count); err != nil {
			return err
		}
		w.keep(b.sums)
	case recCopy:
		st.CopyPages += int64(r.count)
		if err := b.fromStore(r.spid, r.saddr, int(r.count)*PageSize, nil); err != nil {
			return err
		}
	}
	return nil
}

// keep notes a run of the image's pages left in the store, joined to the
// last when it continues it.
func (b *finalBuilder) keep(r keptRun) {
	runs := b.kept[b.id]
	if k := len(runs) - 1; k >= 0 && runs[k].pid == r.pid && runs[k].pos+runs[k].count == r.pos &&
		runs[k].addr+runs[k].count*PageSize == r.addr {
		runs[k].count += r.count
		return
	}
	b.kept[b.id] = append(runs, r)
}

// fromStore appends the n bytes the store holds at (pid, addr) to the
// image, read straight into the image's buffer and, with x (n bytes),
// XORed with it there.
func (b *finalBuilder) fromStore(pid uint32, addr uint64, n int, x []byte) error {
	w := b.w
	for off := 0; off < n; {
		sp := w.space()
		k := min(len(sp), n-off)
		if err := b.s.read(pid, addr+uint64(off), sp[:k]); err != nil {
			return err
		}
		if x != nil {
			xorInto(sp[:k], x[off:off+k])
		}
		w.commit(k)
		off += k
	}
	return nil
}

// abandon closes a half-written image after a failure.
func (b *finalBuilder) abandon() error {
	if b.w == nil {
		return nil
	}
	err := b.w.close()
	b.bufs = b.w.buffers()
	b.w = nil
	return err
}
