package precopy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/cespare/xxhash/v2"
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
	// MetaBytes are the wire bytes of the other images, DeltaBytes those
	// of the pages delta.
	MetaBytes, DeltaBytes int64
	Duration              time.Duration
}

// Bytes is everything the final round put on the wire.
func (f FinalStats) Bytes() int64 { return f.MetaBytes + f.DeltaBytes }

// SendFinal sends the frozen container's CRIU dump in imgDir as a delta
// against what the rounds left on the destination: two streams on conn,
// for Store.RebuildFinal. The first is a directory stream of every image
// except the pages-*.img files, sent as they are; the second carries each
// pages image page by page in its order, as "held at (pid, address)", a
// copy of a page held elsewhere, a zero flag or the data, and a digest of
// the whole image the destination checks.
//
// imgDir must be flat (CRIU's image directory) and stay unchanged during
// the call; a hidden sibling directory of hard links is made and removed.
// After SendFinal the Source is spent: whatever the result, further calls
// fail.
func (s *Source) SendFinal(ctx context.Context, conn *transfer.Conn, imgDir string) (st FinalStats, err error) {
	if s.err != nil {
		return st, s.err
	}
	start := time.Now()
	defer func() { st.Duration = time.Since(start) }()
	images, err := readImages(imgDir, s.log.Warn)
	if err != nil {
		return st, fmt.Errorf("precopy final: %w", err)
	}
	meta, err := linkOthers(imgDir)
	if err != nil {
		return st, fmt.Errorf("precopy final: %w", err)
	}
	defer os.RemoveAll(meta)

	s.err = errors.New("precopy: the final delta was sent already")
	opts := s.cfg.Send
	opts.Name = "precopy-images"
	mst, err := conn.SendDir(ctx, meta, opts)
	st.MetaBytes = mst.WireBytes
	if err != nil {
		s.err = fmt.Errorf("%w: final images: %w", ErrBroken, err)
		return st, s.err
	}
	fr := &finalReader{s: s, ctx: ctx, images: images, st: &st}
	opts.Name = "precopy-final"
	dst, err := conn.SendStream(ctx, fr, opts)
	st.DeltaBytes = dst.WireBytes
	if fr.file != nil {
		fr.file.Close()
	}
	if err != nil {
		s.err = fmt.Errorf("%w: final delta: %w", ErrBroken, err)
		return st, s.err
	}
	s.log.Debug("precopy final", "images", st.Images, "pages", st.Pages, "held", st.HeldPages,
		"copy", st.CopyPages, "zero", st.ZeroPages, "data", st.DataPages,
		"meta_bytes", st.MetaBytes, "delta_bytes", st.DeltaBytes, "ms", time.Since(start).Milliseconds())
	return st, nil
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

// finalReader produces the final delta as SendStream reads it.
type finalReader struct {
	s      *Source
	ctx    context.Context
	images []pagesImage
	st     *FinalStats

	enc   encoder
	off   int
	begun bool
	done  bool

	// The image being read.
	next   int // index of the next image to open
	file   *os.File
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
		r.enc.single(record{typ: recBegin, count: version, pid: kindFinal})
	case r.file != nil && r.left > 0:
		return r.readChunk()
	case r.file != nil:
		err := r.file.Close()
		r.file = nil
		if err != nil {
			return err
		}
		r.enc.single(record{typ: recFileEnd, count: uint32(r.pages), addr: r.digest.Sum64()})
	case r.next < len(r.images):
		im := r.images[r.next]
		r.next++
		f, err := os.Open(im.path)
		if err != nil {
			return err
		}
		pages := uint64(im.size / PageSize)
		if pages > 1<<32-1 {
			f.Close()
			return fmt.Errorf("%s: %d pages is too many", im.path, pages)
		}
		r.file, r.left, r.runs, r.pos, r.pages = f, im.size, im.runs, 0, pages
		r.digest = xxhash.New()
		r.st.Images++
		r.st.DumpBytes += im.size
		r.enc.single(record{typ: recFile, count: uint32(pages), spid: uint32(im.mode), addr: im.id})
	default:
		r.enc.single(record{typ: recEnd, addr: r.enc.pages, saddr: r.enc.records})
		r.done = true
	}
	return nil
}

// readChunk reads the next chunk of the current image and encodes its
// pages.
func (r *finalReader) readChunk() error {
	s := r.s
	n := int(min(r.left, int64(len(s.buf))))
	if _, err := io.ReadFull(r.file, s.buf[:n]); err != nil {
		return fmt.Errorf("read %s: %w", r.file.Name(), err)
	}
	r.left -= int64(n)
	var hb [8]byte
	for off := 0; off < n; off += PageSize {
		data := s.buf[off : off+PageSize]
		h := xxhash.Sum64(data)
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

// page encodes one dumped page whose own address is loc (pid 0: none).
func (r *finalReader) page(loc pageLoc, h uint64, data []byte) {
	s, st := r.s, r.st
	st.Pages++
	m := s.held[loc.pid]
	held, ok := m[loc.addr/PageSize]
	switch src, okc := s.copySource(h, loc); {
	case loc.pid != 0 && ok && held == h:
		st.HeldPages++
		r.enc.page(recHeld, loc.pid, loc.addr, 0, 0, nil)
	case isZeroPage(data, h):
		st.ZeroPages++
		r.enc.page(recZero, loc.pid, loc.addr, 0, 0, nil)
	case okc:
		st.CopyPages++
		r.enc.page(recCopy, loc.pid, loc.addr, src.pid, src.addr, nil)
	default:
		st.DataPages++
		r.enc.page(recData, loc.pid, loc.addr, 0, 0, data)
	}
	// The destination releases what it held at the page's own address.
	if loc.pid != 0 && ok {
		delete(m, loc.addr/PageSize)
	}
}
