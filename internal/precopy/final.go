package precopy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/transfer"
)

// FinalStats describes the final delta.
type FinalStats struct {
	// Images counts pages images; Pages is the pages in them (the dump's
	// memory), DumpBytes their size.
	Images    int
	Pages     int64
	DumpBytes int64
	// Of the dumped pages, HeldPages were already at their address on the
	// destination, CopyPages at another address; ZeroPages went as a flag
	// and DataPages as data: DataPages is what changed since the rounds.
	HeldPages, CopyPages, ZeroPages, DataPages int64
	// XorPages of the DataPages went as their XOR with the page the
	// destination held at their address.
	XorPages int64
	// EarlyImages of the pages images were sent before the dump was done
	// (SendFinal with a DumpWatch).
	EarlyImages int
	// MetaBytes are the wire bytes of the other images, DeltaBytes those
	// of the pages delta.
	MetaBytes, DeltaBytes int64
	Duration              time.Duration
}

// Bytes is everything the final round put on the wire.
func (f FinalStats) Bytes() int64 { return f.MetaBytes + f.DeltaBytes }

// SendFinal sends the frozen container's CRIU dump in imgDir as a delta
// against what the rounds left on the destination: two streams on conn,
// for Store.RebuildFinal. The first carries each pages image page by page
// in its order, as "held at (pid, address)", a copy of a page held
// elsewhere, a zero flag or the data, and a digest of the whole image the
// destination checks; the second is a directory stream of every other
// image, sent as they are.
//
// With a DumpWatch (w, nil without), SendFinal runs while CRIU still
// dumps: each process's pages go as soon as CRIU closed its pages image
// and pagemap, so the transfer overlaps the dump. dumped closes when CRIU
// has written its last image; then the images the watch did not report
// are sent, those it did must be unchanged, and the other images follow.
// stop closes when the dump failed instead: the delta stream then ends
// with an abort (ErrDumpFailed), which leaves conn usable. Without a
// watch, imgDir must be complete and dumped and stop may be nil. imgDir
// must be flat (CRIU's image directory); a hidden sibling directory of
// hard links is made and removed. After SendFinal the Source is spent:
// whatever the result, further calls fail.
func (s *Source) SendFinal(ctx context.Context, conn *transfer.Conn, imgDir string, w *DumpWatch, dumped, stop <-chan struct{}) (st FinalStats, err error) {
	if s.err != nil {
		return st, s.err
	}
	start := time.Now()
	defer func() { st.Duration = time.Since(start) }()
	src := &imageSource{ctx: ctx, dir: imgDir, w: w, dumped: dumped, stop: stop, warn: s.log.Warn, sent: map[uint64]pagesImage{}}
	if w == nil {
		images, err := readImages(imgDir, s.log.Warn)
		if err != nil {
			return st, fmt.Errorf("precopy final: %w", err)
		}
		src.rest, src.swept = images, true
	}

	s.err = errors.New("precopy: the final delta was sent already")
	opts := s.cfg.Send
	fr := &finalReader{s: s, ctx: ctx, next: src.next, ready: src.ready, st: &st}
	opts.Name = "precopy-final"
	dst, err := conn.SendStream(ctx, fr, opts)
	st.DeltaBytes = dst.WireBytes
	fr.closeImage()
	if err != nil {
		s.err = fmt.Errorf("%w: final delta: %w", ErrBroken, err)
		return st, s.err
	}
	st.EarlyImages = src.early
	// Only now is the dump complete.
	meta, err := linkOthers(imgDir)
	if err != nil {
		s.err = fmt.Errorf("%w: final images: %w", ErrBroken, err)
		return st, s.err
	}
	defer os.RemoveAll(meta)
	opts.Name = "precopy-images"
	mst, err := conn.SendDir(ctx, meta, opts)
	st.MetaBytes = mst.WireBytes
	if err != nil {
		s.err = fmt.Errorf("%w: final images: %w", ErrBroken, err)
		return st, s.err
	}
	s.log.Debug("precopy final", "images", st.Images, "pages", st.Pages, "held", st.HeldPages,
		"copy", st.CopyPages, "zero", st.ZeroPages, "data", st.DataPages, "xor", st.XorPages, "early", src.early,
		"meta_bytes", st.MetaBytes, "delta_bytes", st.DeltaBytes, "ms", time.Since(start).Milliseconds())
	return st, nil
}

// ErrDumpFailed ends a final delta whose dump failed (SendFinal's stop).
var ErrDumpFailed = errors.New("precopy: the dump failed")

// imageSource hands the final delta its pages images: those a DumpWatch
// reports complete while CRIU dumps, then, once the dump is done, every
// other one (the sweep).
type imageSource struct {
	ctx    context.Context
	dir    string
	w      *DumpWatch
	dumped <-chan struct{}
	stop   <-chan struct{}
	warn   func(msg string, args ...any)

	sent  map[uint64]pagesImage // by id, as described when sent
	early int                   // images sent before the dump was done
	swept bool
	rest  []pagesImage // after the sweep, those still to send
}

// ready reports whether next would return at once.
func (r *imageSource) ready() bool {
	if r.swept {
		return true
	}
	select {
	case <-r.dumped:
		return true
	default:
	}
	if r.w == nil {
		return false
	}
	r.w.mu.Lock()
	defer r.w.mu.Unlock()
	return len(r.w.ready) > 0 || r.w.err != nil
}

// next returns the next pages image to send; ok is false when all were.
func (r *imageSource) next() (im pagesImage, ok bool, err error) {
	for !r.swept {
		id, pm, got, werr := r.w.take()
		if werr != nil {
			// Not fatal: what the watch missed, the sweep finds.
			r.warn("precopy final: dump watch stopped; the rest goes after the dump", "err", werr)
			r.w = nil
		}
		if got {
			im, err := statPagesImage(r.dir, id)
			if err != nil {
				return im, false, err
			}
			im.locate(pm, true, r.warn)
			r.sent[id] = im
			r.early++
			return im, true, nil
		}
		var changed <-chan struct{}
		if r.w != nil {
			changed = r.w.changed
		}
		select {
		case <-changed:
		case <-r.dumped:
			if err := r.sweep(); err != nil {
				return im, false, err
			}
		case <-r.stop:
			return im, false, ErrDumpFailed
		case <-r.ctx.Done():
			return im, false, r.ctx.Err()
		}
	}
	if len(r.rest) == 0 {
		return im, false, nil
	}
	im, r.rest = r.rest[0], r.rest[1:]
	return im, true, nil
}

// sweep runs once the dump is complete: the images not sent yet are the
// rest, and every image sent early must be as it was when it went (CRIU
// writes an image once; one that changed would leave the destination's
// copy stale).
func (r *imageSource) sweep() error {
	r.swept = true
	all, err := readImages(r.dir, r.warn)
	if err != nil {
		return err
	}
	for _, im := range all {
		was, ok := r.sent[im.id]
		if !ok {
			r.rest = append(r.rest, im)
			continue
		}
		if im.size != was.size || !im.mtime.Equal(was.mtime) || len(im.runs) != len(was.runs) {
			return fmt.Errorf("%s changed after it was sent (%d bytes at %v, then %d at %v)", im.path, was.size, was.mtime, im.size, im.mtime)
		}
	}
	return nil
}

// linkOthers makes a hidden sibling of dir holding hard links to every
// entry of dir except the pages images, with dir's permissions, and
// returns its path.
func linkOthers(dir string) (string, error) {
	info, err := os.Stat(dir)
	if err != nil {
		return "", err
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	meta, err := os.MkdirTemp(filepath.Dir(dir), "."+filepath.Base(dir)+".meta-")
	if err != nil {
		return "", err
	}
	fail := func(err error) (string, error) {
		return "", errors.Join(err, os.RemoveAll(meta))
	}
	if err := os.Chmod(meta, info.Mode().Perm()); err != nil {
		return fail(err)
	}
	for _, e := range ents {
		if isPagesImage(e.Name()) {
			continue
		}
		src, dst := filepath.Join(dir, e.Name()), filepath.Join(meta, e.Name())
		switch {
		case e.Type().IsRegular():
			err = os.Link(src, dst)
		case e.Type()&os.ModeSymlink != 0:
			var target string
			if target, err = os.Readlink(src); err == nil {
				err = os.Symlink(target, dst)
			}
		default:
			err = fmt.Errorf("%s: not a regular file (image directories are flat)", src)
		}
		if err != nil {
			return fail(err)
		}
	}
	return meta, nil
}

// Pending reports whether a Read would return without waiting for the
// dump (transfer.SendStream sends what it has before such a wait).
func (r *finalReader) Pending() bool {
	return r.off < len(r.enc.buf) || r.file != nil || !r.begun || r.done || r.ready == nil || r.ready()
}

// finalReader produces the final delta as SendStream reads it.
type finalReader struct {
	s     *Source
	ctx   context.Context
	next  func() (pagesImage, bool, error) // the next pages image, until false
	ready func() bool                      // whether next would return at once (nil: always)
	st    *FinalStats

	enc   encoder
	off   int
	begun bool
	done  bool

	// The image being read; mem maps it when it is larger than one
	// chunk, so that its pages are hashed and encoded from the page
	// cache instead of copied out first (a smaller one is read: a
	// mapping's set-up and teardown would cost more than the copy).
	file   *os.File
	mem    []byte
	left   int64 // bytes of it still to read
	runs   []pageRun
	pos    uint64 // pages of runs[0] already read
	digest *xxhash.Digest
	pages  uint64
}

func (r *finalReader) Read(p []byte) (int, error) {
	for r.off == len(r.enc.buf) {
		if r.done {
			return 0, io.EOF
		}
		if err := r.ctx.Err(); err != nil {
			return 0, err
		}
		r.enc.buf, r.off = r.enc.buf[:0], 0
		if err := r.produce(); err != nil {
			return 0, err
		}
	}
	n := copy(p, r.enc.buf[r.off:])
	r.off += n
	return n, nil
}

func (r *finalReader) produce() error {
	switch {
	case !r.begun:
		r.begun = true
		// The page hasher's seed: the destination checks the images'
		// digests under the same key.
		k0, k1 := r.s.hash.words()
		r.enc.single(record{typ: recBegin, count: version, pid: kindFinal, addr: k0, saddr: k1})
	case r.file != nil && r.left > 0:
		return r.readChunk()
	case r.file != nil:
		if err := r.closeImage(); err != nil {
			return err
		}
		r.enc.single(record{typ: recFileEnd, count: uint32(r.pages), addr: r.digest.Sum64()})
	default:
		im, ok, err := r.next()
		if err != nil {
			return err
		}
		if !ok {
			r.enc.single(record{typ: recEnd, addr: r.enc.pages, saddr: r.enc.records})
			r.done = true
			return nil
		}
		f, err := os.Open(im.path)
		if err != nil {
			return err
		}
		pages := uint64(im.size / PageSize)
		if pages > 1<<32-1 {
			f.Close()
			return fmt.Errorf("%s: %d pages is too many", im.path, pages)
		}
		var mem []byte
		if im.size > int64(len(r.s.buf)) {
			if mem, err = linux.MapFile(f, im.size); err != nil {
				f.Close()
				return err
			}
		}
		r.file, r.mem, r.left, r.runs, r.pos, r.pages = f, mem, im.size, im.runs, 0, pages
		r.digest = xxhash.New()
		r.st.Images++
		r.st.DumpBytes += im.size
		r.enc.single(record{typ: recFile, count: uint32(pages), spid: uint32(im.mode), addr: im.id})
	}
	return nil
}

// readChunk encodes the next chunk of the current image's pages. A page
// that cannot be read (the image shrank under its mapping) is an error,
// not a crash of the agent.
func (r *finalReader) readChunk() (err error) {
	s := r.s
	n := int(min(r.left, int64(len(s.buf))))
	chunk := s.buf[:n]
	if r.mem != nil {
		off := len(r.mem) - int(r.left)
		chunk = r.mem[off : off+n]
	} else if _, err := io.ReadFull(r.file, chunk); err != nil {
		return fmt.Errorf("read %s: %w", r.file.Name(), err)
	}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if p := recover(); p != nil {
			if f, ok := p.(interface{ Addr() uintptr }); ok {
				err = fmt.Errorf("read %s: fault at %#x in its mapping (the image shrank?)", r.file.Name(), f.Addr())
				return
			}
			panic(p)
		}
	}()
	r.left -= int64(n)
	var hb [8]byte
	for off := 0; off < n; off += PageSize {
		data := chunk[off : off+PageSize]
		h := s.hash.sum(data)
		binary.LittleEndian.PutUint64(hb[:], h)
		r.digest.Write(hb[:])
		var loc pageLoc
		if r.runs != nil {
			run := &r.runs[0]
			loc = pageLoc{run.pid, run.addr + r.pos*PageSize}
			if r.pos++; r.pos == run.count {
				r.runs, r.pos = r.runs[1:], 0
			}
		}
		r.page(loc, h, data)
	}
	r.enc.flush()
	return nil
}

// closeImage unmaps and closes the image being read, if any.
func (r *finalReader) closeImage() error {
	if r.file == nil {
		return nil
	}
	err := errors.Join(linux.Unmap(r.mem), r.file.Close())
	r.file, r.mem = nil, nil
	return err
}

// page encodes one dumped page whose own address is loc (pid 0: none).
func (r *finalReader) page(loc pageLoc, h uint64, data []byte) {
	s, st := r.s, r.st
	st.Pages++
	m := s.held[loc.pid]
	held, ok := m[loc.addr/PageSize]
	switch {
	case loc.pid != 0 && ok && held == h:
		st.HeldPages++
		r.enc.page(recHeld, loc.pid, loc.addr, 0, 0, nil)
	case s.isZeroPage(data, h):
		st.ZeroPages++
		r.enc.page(recZero, loc.pid, loc.addr, 0, 0, nil)
	default:
		// Most pages are held where they are: the index is looked up
		// only for the others.
		if src, okc := s.copySource(h, loc); okc {
			st.CopyPages++
			r.enc.page(recCopy, loc.pid, loc.addr, src.pid, src.addr, nil)
			break
		}
		st.DataPages++
		if s.encodeData(&r.enc, loc, held, ok, data) {
			st.XorPages++
		}
	}
	// The destination releases what it held at the page's own address.
	if loc.pid != 0 && ok {
		delete(m, loc.addr/PageSize)
	}
}
