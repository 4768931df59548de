package transfer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
	"github.com/klauspost/compress/zstd"
)

// SendDir sends the directory tree at srcDir as one stream, for RecvDir on
// the other side: regular files, directories and symlinks with permission
// bits, owners and modification times. With opts.Overlay it also sends
// special files, hard links and extended attributes (see
// SendOptions.Overlay); without it a special file aborts the stream and
// hard links arrive as separate files. Files are read ahead of the network
// by a pipeline of opts.Depth chunks. A file that cannot be read aborts the
// stream: the receiver gets ErrAborted, and the connection stays usable.
func (c *Conn) SendDir(ctx context.Context, srcDir string, opts SendOptions) (Stats, error) {
	return c.sendDir(ctx, srcDir, opts, func(p *producer, root string) error {
		return p.walk(root, opts.Overlay, opts.Live, nil)
	})
}

// SendDirAsWritten sends the flat directory srcDir (no subdirectories) as
// SendDir does, for RecvDir on the other side, while its files are still
// being written: each regular file named on written (a name in srcDir,
// which its writer closed and will not change again) goes as soon as it
// is named, and once written is closed, the directory complete, a walk
// sends the files not sent yet. Names of files sent already, or not in
// srcDir, are ignored. Closing halt instead ends the stream with an abort
// and returns ErrHalted: the receiver gets ErrAborted, the connection
// stays usable. opts.Overlay and opts.Live do not apply; the root's
// entry goes first, with its times as the stream begins.
func (c *Conn) SendDirAsWritten(ctx context.Context, srcDir string, written <-chan string, halt <-chan struct{}, opts SendOptions) (Stats, error) {
	return c.sendDir(ctx, srcDir, opts, func(p *producer, root string) error {
		return p.walkAsWritten(root, written, halt)
	})
}

// sendDir resolves srcDir, checks that it is a directory and sends it as
// a directory stream whose entries walk produces from the resolved root.
func (c *Conn) sendDir(ctx context.Context, srcDir string, opts SendOptions, walk func(p *producer, root string) error) (Stats, error) {
	root, err := filepath.EvalSymlinks(srcDir)
	if err != nil {
		return Stats{}, fmt.Errorf("send dir %s: %w", srcDir, err)
	}
	fi, err := os.Stat(root)
	if err != nil {
		return Stats{}, fmt.Errorf("send dir %s: %w", srcDir, err)
	}
	if !fi.IsDir() {
		return Stats{}, fmt.Errorf("send dir %s: not a directory", srcDir)
	}
	st, err := c.sendStream(ctx, streamHeader{Kind: streamDir}, opts, func(p *producer) error {
		return walk(p, root)
	})
	if err != nil {
		return st, fmt.Errorf("send dir %s: %w", srcDir, err)
	}
	return st, nil
}

// SendStream sends everything r yields until io.EOF as one object, for
// RecvStream or RecvFile on the other side. The size need not be known: r
// may produce data while it is being sent. Data goes in chunks of
// opts.ChunkSize, or sooner when r returns a short read after at least
// 64 KiB, so a slow producer's data is not held back for long.
//
// SendStream reads r from its own goroutine and returns only after that
// read returns, so r must not block indefinitely once ctx is done. An r
// with a method Pending() bool, which reports false when its next Read
// would wait for data not there yet, has what it produced so far sent
// before that wait.
func (c *Conn) SendStream(ctx context.Context, r io.Reader, opts SendOptions) (Stats, error) {
	st, err := c.sendStream(ctx, streamHeader{Kind: streamObject}, opts, func(p *producer) error {
		return p.copyFrom(r)
	})
	if err != nil {
		return st, fmt.Errorf("send stream %s: %w", opts.Name, err)
	}
	return st, nil
}

// SendFile sends the regular file at path as one object with its
// permission bits, for RecvFile (or RecvStream) on the other side.
func (c *Conn) SendFile(ctx context.Context, path string, opts SendOptions) (Stats, error) {
	f, err := os.Open(path)
	if err != nil {
		return Stats{}, fmt.Errorf("send file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return Stats{}, fmt.Errorf("send file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return Stats{}, fmt.Errorf("send file %s: not a regular file", path)
	}
	hdr := streamHeader{Kind: streamObject, Mode: uint32(fi.Mode() & modeMask)}
	st, err := c.sendStream(ctx, hdr, opts, func(p *producer) error {
		return p.copyFrom(f)
	})
	if err != nil {
		return st, fmt.Errorf("send file %s: %w", path, err)
	}
	return st, nil
}

// sendStream writes a stream: its header, the frames produce makes on a
// producer goroutine, and the summary (or an abort when produce failed).
// The calling goroutine does the network writes, so reading, hashing and
// compressing overlap with sending.
func (c *Conn) sendStream(ctx context.Context, hdr streamHeader, opts SendOptions, produce func(*producer) error) (st Stats, err error) {
	opts, err = opts.withDefaults()
	if err != nil {
		return Stats{}, err
	}
	hdr.Name = opts.Name
	hdr.Compression = opts.Compression.String()
	hp, err := json.Marshal(hdr)
	if err != nil {
		return Stats{}, err
	}

	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.werr != nil {
		return Stats{}, c.werr
	}
	var enc *zstd.Encoder
	floor := c.encSpeed
	if opts.Compression != CompressOff {
		if c.slowLink(opts.LinkBitsPerSecond) {
			enc, err = c.denseEncoderLocked()
			floor /= denseSlowdown
		} else {
			enc, err = c.encoderLocked()
		}
		if err != nil {
			return Stats{}, err
		}
	}
	stop := c.watch(ctx)
	defer stop()

	start := time.Now()
	st = Stats{Name: opts.Name, Compression: opts.Compression}
	defer func() { st.Duration = time.Since(start) }()
	n, err := c.writeControlLocked(kindBegin, hp)
	if err != nil {
		return st, c.failWriteLocked(ctx, err)
	}
	st.WireBytes += int64(n)

	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	items := make(chan item, opts.Depth)
	p := newProducer(pctx, items, opts, enc)
	p.auto.floor = floor
	var perr error
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(items)
		perr = produce(p)
	})

	// Write frames as they come; flush only when the producer has nothing
	// ready, so small frames coalesce and large ones go straight through.
	var werr error
	for {
		var it item
		var ok bool
		select {
		case it, ok = <-items:
		default:
			if werr == nil && c.bw.Buffered() > 0 {
				if err := c.bw.Flush(); err != nil {
					werr = err
					cancel()
				}
			}
			it, ok = <-items
		}
		if !ok {
			break
		}
		if werr == nil {
			if _, err := c.bw.Write(it.frame); err != nil {
				werr = err
				cancel() // stop the producer; keep draining so it can exit
			} else {
				st.WireBytes += int64(len(it.frame))
			}
		}
		p.recycle(it.buf)
	}
	wg.Wait()
	p.fill(&st)

	switch {
	case werr != nil:
		return st, c.failWriteLocked(ctx, werr)
	case perr != nil && ctx.Err() != nil:
		return st, c.failWriteLocked(ctx, perr)
	case perr != nil:
		// The frames so far are whole: end the stream with an abort so the
		// receiver discards it and the connection stays in step.
		ap, _ := json.Marshal(abortMsg{Error: perr.Error()})
		n, err := c.writeControlLocked(kindAbort, ap)
		if err == nil {
			err = c.bw.Flush()
		}
		if err != nil {
			return st, errors.Join(perr, c.failWriteLocked(ctx, err))
		}
		st.WireBytes += int64(n)
		return st, perr
	}

	sp, err := json.Marshal(summaryOf(st))
	if err != nil {
		return st, err
	}
	n, err = c.writeControlLocked(kindEnd, sp)
	if err == nil {
		err = c.bw.Flush()
	}
	if err != nil {
		return st, c.failWriteLocked(ctx, err)
	}
	st.WireBytes += int64(n)
	return st, nil
}

// encoderLocked returns the connection's zstd encoder, made on first use.
// EncodeAll is safe for concurrent use. The caller holds wmu.
func (c *Conn) encoderLocked() (*zstd.Encoder, error) {
	if c.enc == nil {
		enc, err := zstd.NewWriter(nil,
			zstd.WithEncoderLevel(zstd.SpeedFastest),
			zstd.WithEncoderConcurrency(1),
			zstd.WithEncoderCRC(false), // frames carry their own CRC
		)
		if err != nil {
			return nil, fmt.Errorf("zstd encoder: %w", err)
		}
		c.enc = enc
	}
	return c.enc, nil
}

// denseLinkFactor is how many times faster than the link the fast
// encoder must be, as WarmCompression measured it, for a stream to use
// the dense one; denseSlowdown is about how much slower the dense one
// runs. WarmCompression's buffer is half zeros, which the fast level
// crosses at 2.3-2.7 GB/s here, several times its rate on memory pages:
// at 40 the dense level still outruns the link about 4 times on real
// data. So a 100 Mbit/s link takes it, where the stream's time is the
// wire's and the smaller output shortens it, and a 1 Gbit/s link here
// does not (it would need 5 GB/s).
const (
	denseLinkFactor = 40
	denseSlowdown   = 2.5
)

// slowLink says whether a stream over a link of bps bits per second (0:
// unknown) takes the dense encoder. The caller holds wmu.
func (c *Conn) slowLink(bps int64) bool {
	return bps > 0 && c.encSpeed > denseLinkFactor*float64(bps)/8
}

// denseEncoderLocked returns the connection's dense zstd encoder (zstd's
// default level), made on first use. The caller holds wmu.
func (c *Conn) denseEncoderLocked() (*zstd.Encoder, error) {
	if c.dense == nil {
		enc, err := zstd.NewWriter(nil,
			zstd.WithEncoderLevel(zstd.SpeedDefault),
			zstd.WithEncoderConcurrency(1),
			zstd.WithEncoderCRC(false),
		)
		if err != nil {
			return nil, fmt.Errorf("zstd encoder: %w", err)
		}
		c.dense = enc
	}
	return c.dense, nil
}

// WarmCompression makes the connection's zstd encoder, runs it once over
// a chunk and times a second run. Call it before the time-critical part of
// a transfer: neither the encoder's allocation nor its first pass then
// falls inside it, and CompressAuto takes the measured rate as the least
// it expects of this CPU. Its own probe is one chunk timed in the middle
// of a busy moment (a migration's frozen window, with CRIU and runc
// exiting on two cores): measured there, zstd's fastest level looked like
// 40-130 MB/s, under a 1 Gbit/s link, and auto left compression off for
// images that shrink 5 to 28 times.
func (c *Conn) WarmCompression() error {
	c.wmu.Lock()
	enc, err := c.encoderLocked()
	c.wmu.Unlock()
	if err != nil {
		return err
	}
	buf := make([]byte, DefaultChunkSize)
	for i := range buf { // half compressible, half not, like memory pages
		if i%8192 >= 4096 {
			buf[i] = byte(uint32(i) * 2654435761 >> 13)
		}
	}
	dst := make([]byte, 0, enc.MaxEncodedSize(len(buf)))
	_ = enc.EncodeAll(buf, dst)
	t0 := time.Now()
	_ = enc.EncodeAll(buf, dst)
	speed := float64(len(buf)) / max(time.Since(t0).Seconds(), 1e-9)
	c.wmu.Lock()
	c.encSpeed = speed
	c.wmu.Unlock()
	return nil
}

// item is one frame ready to write. buf, when set, goes back to the pool
// once the frame is written.
type item struct {
	frame []byte
	buf   *chunkBuf
}

// chunkBuf holds one chunk with room for a frame header in front, and a
// second buffer for its compressed form.
type chunkBuf struct {
	raw  []byte
	comp []byte
}

// producer reads content, hashes it, compresses it and frames it, on its
// own goroutine. Its fields are owned by that goroutine until sendStream's
// wg.Wait, except pool, which both sides use.
type producer struct {
	ctx    context.Context
	out    chan<- item
	pool   chan *chunkBuf
	nbufs  int // buffers allocated so far, at most cap(pool)
	chunk  int
	mode   Compression
	enc    *zstd.Encoder
	auto   autoState
	digest contentDigest
	tee    func(rel string, info fs.FileInfo) io.Writer // SendOptions.Tee
	st     Stats                                        // counts and compression fields only
}

func newProducer(ctx context.Context, out chan<- item, opts SendOptions, enc *zstd.Encoder) *producer {
	return &producer{
		ctx: ctx,
		out: out,
		// Depth chunks queued, one being written, one being filled.
		pool:   make(chan *chunkBuf, opts.Depth+2),
		chunk:  opts.ChunkSize,
		mode:   opts.Compression,
		enc:    enc,
		auto:   autoState{link: float64(opts.LinkBitsPerSecond) / 8},
		digest: newContentDigest(),
		tee:    opts.Tee,
	}
}

// fill copies the producer's accounting into st. Call after it finished.
func (p *producer) fill(st *Stats) {
	st.Files, st.Dirs, st.Symlinks = p.st.Files, p.st.Dirs, p.st.Symlinks
	st.Specials, st.Hardlinks, st.EarlyFiles = p.st.Specials, p.st.Hardlinks, p.st.EarlyFiles
	st.PayloadBytes = p.st.PayloadBytes
	st.Chunks, st.CompressedChunks, st.ZeroChunks = p.st.Chunks, p.st.CompressedChunks, p.st.ZeroChunks
	st.CompressedBytes, st.ZeroBytes = p.st.CompressedBytes, p.st.ZeroBytes
	st.Compressed = st.mostlyCompressed()
	if p.mode == CompressAuto {
		st.AutoNote = p.auto.String()
	}
	st.Digest = p.digest.sum()
}

func (p *producer) recycle(b *chunkBuf) {
	if b != nil {
		p.pool <- b // never blocks: at most cap(pool) buffers exist
	}
}

func (p *producer) getBuf() (*chunkBuf, error) {
	select {
	case b := <-p.pool:
		return b, nil
	default:
	}
	if p.nbufs < cap(p.pool) {
		p.nbufs++
		return &chunkBuf{raw: make([]byte, headerLen+p.chunk)}, nil
	}
	select {
	case b := <-p.pool:
		return b, nil
	case <-p.ctx.Done():
		return nil, p.ctx.Err()
	}
}

func (p *producer) send(it item) error {
	select {
	case p.out <- it:
		return nil
	case <-p.ctx.Done():
		p.recycle(it.buf)
		return p.ctx.Err()
	}
}

func (p *producer) sendControl(k kind, payload []byte) error {
	frame := make([]byte, headerLen+len(payload))
	copy(frame[headerLen:], payload)
	putHeader(frame, k, 0, payload, len(payload))
	return p.send(item{frame: frame})
}

func (p *producer) sendEntry(e entry) error {
	payload, err := json.Marshal(e)
	if err != nil {
		return err
	}
	p.digest.entry(payload)
	return p.sendControl(kindEntry, payload)
}

// fileID identifies an inode, to send each hard-linked one once.
type fileID struct{ dev, ino uint64 }

// walk sends the tree under root in lexical order, parents first. With
// overlay it also sends special files, hard links and extended attributes.
// Entries named in skip (paths relative to root) are left out.
func (p *producer) walk(root string, overlay, live bool, skip map[string]bool) error {
	links := map[fileID]string{} // first path of each inode with more than one link
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if goneFromLive(live, root, path, err) {
				return nil
			}
			return err
		}
		if err := p.ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if skip[rel] {
			return nil
		}
		return p.sendPath(root, path, rel, d, links, overlay, live)
	})
}

// goneFromLive reports whether err says that path, an entry under root
// of a live tree (one still being written), was removed since it was
// listed: such an entry is left out of the stream. The root itself must
// stay.
func goneFromLive(live bool, root, path string, err error) bool {
	return live && path != root && errors.Is(err, fs.ErrNotExist)
}

// sendPath sends the entry at path (rel to the stream's root), and a
// regular file's content. links records hard-linked inodes sent so far.
// An entry of a live tree removed meanwhile is left out.
func (p *producer) sendPath(root, path, rel string, d fs.DirEntry, links map[fileID]string, overlay, live bool) error {
	gone := func(err error) bool { return goneFromLive(live, root, path, err) }
	info, err := d.Info()
	if err != nil {
		if gone(err) {
			return nil
		}
		return err
	}
	e := entry{Path: rel, Mode: uint32(info.Mode() & modeMask), MTime: info.ModTime().UnixNano()}
	sys, _ := info.Sys().(*syscall.Stat_t)
	if sys != nil {
		e.UID, e.GID = int(sys.Uid), int(sys.Gid)
	}
	// skip leaves out an entry of a live tree that vanished, and
	// forgets it as the first name of its inode.
	var linkID *fileID
	skip := func() error {
		if linkID != nil {
			delete(links, *linkID)
		}
		return nil
	}
	if overlay {
		if sys != nil && !d.IsDir() && sys.Nlink > 1 {
			id := fileID{dev: sys.Dev, ino: sys.Ino}
			if first, ok := links[id]; ok {
				p.st.Hardlinks++
				return p.sendEntry(entry{Path: rel, Type: entryHardlink, Target: first})
			}
			links[id], linkID = rel, &id
		}
		if e.Xattrs, err = linux.Lxattrs(path, keepXattr); err != nil {
			if gone(err) {
				return skip()
			}
			return err
		}
	}
	switch {
	case d.IsDir():
		e.Type = entryDir
		p.st.Dirs++
		return p.sendEntry(e)
	case d.Type()&fs.ModeSymlink != 0:
		e.Type = entrySymlink
		e.Mode = 0
		if e.Target, err = os.Readlink(path); err != nil {
			if gone(err) {
				return skip()
			}
			return err
		}
		p.st.Symlinks++
		return p.sendEntry(e)
	case d.Type().IsRegular():
		e.Type = entryFile
		f, err := os.Open(path)
		if err != nil {
			if gone(err) {
				return skip()
			}
			return err
		}
		defer f.Close()
		p.st.Files++
		if err := p.sendEntry(e); err != nil {
			return err
		}
		var r io.Reader = f
		if p.tee != nil {
			if w := p.tee(rel, info); w != nil {
				r = io.TeeReader(f, w)
			}
		}
		if err := p.copyFrom(r); err != nil {
			return fmt.Errorf("read %s: %w", path, err)
		}
		return nil
	case overlay && sys != nil && specialType(d.Type()) != "":
		e.Type = specialType(d.Type())
		if d.Type()&fs.ModeDevice != 0 {
			e.Major, e.Minor = linux.DeviceNumbers(sys.Rdev)
		}
		p.st.Specials++
		return p.sendEntry(e)
	default:
		return fmt.Errorf("%s: unsupported file type %v", path, d.Type())
	}
}

// ErrHalted ends a stream of SendDirAsWritten whose halt was closed.
var ErrHalted = errors.New("halted by the sender")

// walkAsWritten is SendDirAsWritten's producer: the root, then each file
// named on written as it comes, then the rest of the tree once written is
// closed.
func (p *producer) walkAsWritten(root string, written <-chan string, halt <-chan struct{}) error {
	links := map[fileID]string{}
	fi, err := os.Lstat(root)
	if err != nil {
		return err
	}
	if err := p.sendPath(root, root, ".", fs.FileInfoToDirEntry(fi), links, false, false); err != nil {
		return err
	}
	sent := map[string]bool{".": true}
	for {
		select {
		case name, ok := <-written:
			if !ok {
				return p.walk(root, false, false, sent)
			}
			if name == "" || name == "." || name == ".." || filepath.Base(name) != name || sent[name] {
				continue
			}
			path := filepath.Join(root, name)
			fi, err := os.Lstat(path)
			if errors.Is(err, fs.ErrNotExist) {
				continue // the walk sends it if it comes back
			}
			if err != nil {
				return err
			}
			if !fi.Mode().IsRegular() {
				continue // the walk sends it, or refuses it
			}
			sent[name] = true
			if err := p.sendPath(root, path, name, fs.FileInfoToDirEntry(fi), links, false, false); err != nil {
				return err
			}
			p.st.EarlyFiles++
		case <-halt:
			return ErrHalted
		case <-p.ctx.Done():
			return p.ctx.Err()
		}
	}
}

// specialType returns the entry type of a special file's type bits, or "".
func specialType(t fs.FileMode) string {
	for name, bits := range specialTypes {
		if t.Type() == bits {
			return name
		}
	}
	return ""
}

// minFlush is how much a short read must have gathered before its chunk
// is sent without waiting for a full one.
const minFlush = 64 << 10

// copyFrom sends r's content as data frames until io.EOF.
func (p *producer) copyFrom(r io.Reader) error {
	for {
		b, err := p.getBuf()
		if err != nil {
			return err
		}
		n, rerr := fillChunk(r, b.raw[headerLen:headerLen+p.chunk])
		if n > 0 {
			if err := p.sendChunk(b, n); err != nil {
				return err
			}
		} else {
			p.recycle(b)
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return rerr
		}
	}
}

// fillChunk reads into b until it is full, r fails or ends, or a short read
// has gathered at least minFlush bytes (data from a pipe goes out without
// waiting for a full chunk; a regular file reads full chunks), or r says
// its next read would wait (Pending, see SendStream).
func fillChunk(r io.Reader, b []byte) (int, error) {
	pr, _ := r.(interface{ Pending() bool })
	n := 0
	for n < len(b) {
		want := len(b) - n
		m, err := r.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
		if m < want && n >= minFlush {
			break
		}
		if pr != nil && n > 0 && !pr.Pending() {
			break
		}
	}
	return n, nil
}

// sendChunk frames the n bytes at b.raw[headerLen:] and queues them.
func (p *producer) sendChunk(b *chunkBuf, n int) error {
	data := b.raw[headerLen : headerLen+n]
	p.st.Chunks++
	p.st.PayloadBytes += int64(n)
	if isZero(data) {
		p.st.ZeroChunks++
		p.st.ZeroBytes += int64(n)
		p.digest.zeros(n)
		putHeader(b.raw, kindData, flagZero, nil, n)
		return p.send(item{frame: b.raw[:headerLen], buf: b})
	}
	p.digest.data(data)
	if payload, ok := p.compress(data, b); ok {
		p.st.CompressedChunks++
		p.st.CompressedBytes += int64(n)
		frame := b.comp[:headerLen+len(payload)]
		putHeader(frame, kindData, flagZstd, payload, n)
		return p.send(item{frame: frame, buf: b})
	}
	frame := b.raw[:headerLen+n]
	putHeader(frame, kindData, 0, data, n)
	return p.send(item{frame: frame, buf: b})
}

// compress returns data's zstd form (in b.comp after a header's room) and
// true when the mode calls for compressing this chunk and the result is
// smaller.
func (p *producer) compress(data []byte, b *chunkBuf) ([]byte, bool) {
	if p.mode == CompressOff || (p.mode == CompressAuto && !p.auto.wantProbe(len(data))) {
		return nil, false
	}
	if b.comp == nil {
		b.comp = make([]byte, headerLen, headerLen+p.enc.MaxEncodedSize(p.chunk))
	}
	t0 := time.Now()
	out := p.enc.EncodeAll(data, b.comp[:headerLen])
	elapsed := time.Since(t0)
	b.comp = out[:headerLen]
	payload := out[headerLen:]
	if p.mode == CompressAuto {
		p.auto.observe(len(data), len(payload), elapsed)
	}
	return payload, len(payload) < len(data)
}
