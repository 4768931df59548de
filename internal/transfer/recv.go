package transfer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
	"github.com/klauspost/compress/zstd"
)

// sink is where a received stream's content goes: a directory being built
// or an object being written.
type sink interface {
	entry(e entry) error
	write(p []byte) error
	zeros(n int) error
}

// RecvDir receives a directory stream sent by SendDir into dstDir, which
// must not exist (its parent is created if missing). The tree is built in a
// temporary sibling directory and renamed to dstDir only after the
// sender's summary matched; on any error nothing is left behind.
//
// Entries get the sender's modes and modification times, and its owners
// when this process runs as root (as tar does). Special files, hard links
// and extended attributes from a SendOptions.Overlay stream are recreated
// (mknod, link, lsetxattr); device nodes and trusted.* attributes need
// root, and without it the stream fails. If dstDir exists, RecvDir fails
// before reading anything.
//
// Paths that are absolute, not clean, leave the tree ("..") or pass
// through anything but a directory received earlier in the same stream
// fail with ErrUnsafePath; symlinks are created as sent and never followed.
func (c *Conn) RecvDir(ctx context.Context, dstDir string, opts RecvOptions) (Stats, error) {
	if _, err := os.Lstat(dstDir); err == nil {
		return Stats{}, fmt.Errorf("recv dir %s: %w", dstDir, fs.ErrExist)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return Stats{}, fmt.Errorf("recv dir: %w", err)
	}
	parent := filepath.Dir(dstDir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return Stats{}, fmt.Errorf("recv dir: %w", err)
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(dstDir)+".partial-")
	if err != nil {
		return Stats{}, fmt.Errorf("recv dir: %w", err)
	}
	d := newDirSink(tmp)
	_, st, err := c.recvStream(ctx, streamDir, opts, d)
	if err == nil {
		err = d.finish(dstDir)
	}
	if err != nil {
		return st, fmt.Errorf("recv dir %s: %w", dstDir, errors.Join(err, d.discard()))
	}
	return st, nil
}

// RecvStream receives an object stream sent by SendStream or SendFile and
// writes its content to w as it arrives. On error w holds a prefix of the
// object (or of what the sender could read, for ErrAborted): discard it.
func (c *Conn) RecvStream(ctx context.Context, w io.Writer, opts RecvOptions) (Stats, error) {
	_, st, err := c.recvStream(ctx, streamObject, opts, writerSink{w})
	if err != nil {
		return st, fmt.Errorf("recv stream: %w", err)
	}
	return st, nil
}

// RecvFile receives an object stream into a new file at path, written to a
// temporary sibling and renamed on success (nothing is left on error).
// Runs of zeros become holes. The file gets the mode SendFile sent, or
// 0600 for a SendStream object.
func (c *Conn) RecvFile(ctx context.Context, path string, opts RecvOptions) (Stats, error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".partial-")
	if err != nil {
		return Stats{}, fmt.Errorf("recv file: %w", err)
	}
	fsink := &fileSink{f: f}
	hdr, st, err := c.recvStream(ctx, streamObject, opts, fsink)
	if err == nil {
		err = fsink.close()
	}
	if err == nil && hdr.Mode != 0 {
		err = os.Chmod(f.Name(), os.FileMode(hdr.Mode)&modeMask)
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		_ = f.Close()
		return st, fmt.Errorf("recv file %s: %w", path, errors.Join(err, removeIfExists(f.Name())))
	}
	return st, nil
}

// recvStream reads one stream of the wanted kind into s and checks its
// summary. The caller cleans s up on error.
func (c *Conn) recvStream(ctx context.Context, want string, opts RecvOptions, s sink) (streamHeader, Stats, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if c.rerr != nil {
		return streamHeader{}, Stats{}, c.rerr
	}
	stop := c.watch(ctx)
	defer stop()

	var st Stats
	h, payload, err := c.readFrameLocked(false)
	if err != nil {
		return streamHeader{}, st, c.failReadLocked(ctx, err)
	}
	start := time.Now()
	st.WireBytes += headerLen + int64(len(payload))
	if h.kind == kindMsg {
		// A peer that gives up mid-transfer says why in a message.
		var env envelope
		if json.Unmarshal(payload, &env) == nil && env.Type != "" {
			return streamHeader{}, st, c.failReadLocked(ctx, &MsgInsteadError{Type: env.Type, Body: env.Body})
		}
	}
	if h.kind != kindBegin {
		return streamHeader{}, st, c.failReadLocked(ctx, fmt.Errorf("%w: got %s, want stream start", ErrProtocol, h.kind))
	}
	var hdr streamHeader
	if err := json.Unmarshal(payload, &hdr); err != nil {
		return hdr, st, c.failReadLocked(ctx, fmt.Errorf("%w: stream header: %v", ErrCorrupt, err))
	}
	if hdr.Kind != want {
		return hdr, st, c.failReadLocked(ctx, fmt.Errorf("%w: got a %q stream, want %q", ErrProtocol, hdr.Kind, want))
	}
	st.Name = hdr.Name
	if st.Compression, err = ParseCompression(hdr.Compression); err != nil {
		return hdr, st, c.failReadLocked(ctx, fmt.Errorf("%w: %v", ErrProtocol, err))
	}

	digest := newContentDigest()
	for {
		h, payload, err := c.readFrameLocked(false)
		if err != nil {
			return hdr, st, c.failReadLocked(ctx, err)
		}
		st.WireBytes += headerLen + int64(len(payload))
		switch h.kind {
		case kindEntry:
			if want != streamDir {
				return hdr, st, c.failReadLocked(ctx, fmt.Errorf("%w: entry in an object stream", ErrProtocol))
			}
			var e entry
			if err := json.Unmarshal(payload, &e); err != nil {
				return hdr, st, c.failReadLocked(ctx, fmt.Errorf("%w: entry: %v", ErrCorrupt, err))
			}
			digest.entry(payload)
			switch e.Type {
			case entryDir:
				st.Dirs++
			case entryFile:
				st.Files++
			case entrySymlink:
				st.Symlinks++
			case entryCharDev, entryBlockDev, entryFIFO, entrySocket:
				st.Specials++
			case entryHardlink:
				st.Hardlinks++
			}
			if err := s.entry(e); err != nil {
				return hdr, st, c.failReadLocked(ctx, err)
			}

		case kindData:
			st.Chunks++
			st.PayloadBytes += int64(h.rawLen)
			if opts.MaxBytes > 0 && st.PayloadBytes > opts.MaxBytes {
				return hdr, st, c.failReadLocked(ctx, fmt.Errorf("%w: more than %d bytes", ErrTooLarge, opts.MaxBytes))
			}
			if h.flags&flagZero != 0 {
				st.ZeroChunks++
				st.ZeroBytes += int64(h.rawLen)
				digest.zeros(int(h.rawLen))
				err = s.zeros(int(h.rawLen))
			} else {
				var data []byte
				if data, err = c.decodeLocked(h, payload); err == nil {
					if h.flags&flagZstd != 0 {
						st.CompressedChunks++
						st.CompressedBytes += int64(h.rawLen)
					}
					digest.data(data)
					err = s.write(data)
				}
			}
			if err != nil {
				return hdr, st, c.failReadLocked(ctx, err)
			}

		case kindEnd:
			st.Compressed = st.mostlyCompressed()
			var got summary
			if err := json.Unmarshal(payload, &got); err != nil {
				return hdr, st, c.failReadLocked(ctx, fmt.Errorf("%w: summary: %v", ErrCorrupt, err))
			}
			st.Digest = digest.sum()
			st.Duration = time.Since(start)
			if mine := summaryOf(st); got != mine {
				return hdr, st, c.failReadLocked(ctx, fmt.Errorf("%w: summary mismatch: sender %+v, received %+v", ErrCorrupt, got, mine))
			}
			return hdr, st, nil

		case kindAbort:
			var a abortMsg
			_ = json.Unmarshal(payload, &a)
			// The sender ended the stream cleanly: the connection is still
			// in step, so this is not recorded as a broken receive side.
			return hdr, st, fmt.Errorf("%w: %s", ErrAborted, a.Error)

		default:
			return hdr, st, c.failReadLocked(ctx, fmt.Errorf("%w: %s inside a stream", ErrProtocol, h.kind))
		}
	}
}

// decodeLocked returns a data frame's content, decompressing it into a
// reused buffer when it is compressed. The caller holds rmu.
func (c *Conn) decodeLocked(h header, payload []byte) ([]byte, error) {
	if h.flags&flagZstd == 0 {
		return payload, nil
	}
	if c.dec == nil {
		dec, err := zstd.NewReader(nil,
			zstd.WithDecoderConcurrency(1),
			zstd.WithDecoderMaxMemory(MaxChunkSize),
			zstd.WithDecodeAllCapLimit(true),
		)
		if err != nil {
			return nil, fmt.Errorf("zstd decoder: %w", err)
		}
		c.dec = dec
	}
	if cap(c.dbuf) < int(h.rawLen) {
		c.dbuf = make([]byte, 0, h.rawLen)
	}
	out, err := c.dec.DecodeAll(payload, c.dbuf[:0:h.rawLen])
	if err != nil {
		return nil, fmt.Errorf("%w: decompress chunk: %v", ErrCorrupt, err)
	}
	if len(out) != int(h.rawLen) {
		return nil, fmt.Errorf("%w: chunk decompressed to %d bytes, want %d", ErrCorrupt, len(out), h.rawLen)
	}
	return out, nil
}

// checkPath accepts a clean, relative, slash-separated path inside the
// tree. "." (the root) is accepted here and handled by the caller.
func checkPath(p string) error {
	switch {
	case p == "" || strings.IndexByte(p, 0) >= 0:
		return fmt.Errorf("%w: %q", ErrUnsafePath, p)
	case path.IsAbs(p):
		return fmt.Errorf("%w: absolute path %q", ErrUnsafePath, p)
	case path.Clean(p) != p:
		return fmt.Errorf("%w: path %q is not clean", ErrUnsafePath, p)
	case p == ".." || strings.HasPrefix(p, "../"):
		return fmt.Errorf("%w: path %q leaves the tree", ErrUnsafePath, p)
	}
	return nil
}

// dirSink builds a received tree under root, a temporary directory.
// Directories are created 0700 and get their metadata last, children
// first (a read-only directory must still receive its files, and writing a
// child changes its parent's mtime); files are written 0600 and get theirs
// when complete; other entries get theirs at once.
type dirSink struct {
	root    string
	dirs    map[string]entry // received directories by path, "." included
	order   []string         // dirs in creation order
	nondirs map[string]bool  // received non-directories: hard link targets
	file    *fileSink        // the file being written, if any
	fileEnt entry            // its entry
	gotRoot bool
	chown   bool // running as root: apply owners
}

func newDirSink(root string) *dirSink {
	return &dirSink{root: root, dirs: map[string]entry{}, nondirs: map[string]bool{}, chown: os.Geteuid() == 0}
}

func (d *dirSink) full(p string) string { return filepath.Join(d.root, filepath.FromSlash(p)) }

// applyMeta gives an entry its owner, extended attributes, mode and mtime,
// in that order: chown clears setuid, setgid and security.capability, and
// user.* attributes need write permission that the final mode may deny.
// Symlinks have no mode of their own.
func (d *dirSink) applyMeta(e entry) error {
	full := d.full(e.Path)
	if d.chown {
		if err := os.Lchown(full, e.UID, e.GID); err != nil {
			return err
		}
	}
	for _, name := range slices.Sorted(maps.Keys(e.Xattrs)) {
		if err := linux.Lsetxattr(full, name, e.Xattrs[name]); err != nil {
			return err
		}
	}
	if e.Type != entrySymlink {
		if err := os.Chmod(full, os.FileMode(e.Mode)); err != nil {
			return err
		}
	}
	t := time.Unix(0, e.MTime)
	return linux.Lutimes(full, t, t)
}

func (d *dirSink) entry(e entry) error {
	if err := d.closeFile(); err != nil {
		return err
	}
	if err := checkPath(e.Path); err != nil {
		return err
	}
	if os.FileMode(e.Mode)&^modeMask != 0 {
		return fmt.Errorf("%w: %s: mode %#o has bits beyond permissions", ErrProtocol, e.Path, e.Mode)
	}
	if e.UID < 0 || e.GID < 0 {
		return fmt.Errorf("%w: %s: negative owner %d:%d", ErrProtocol, e.Path, e.UID, e.GID)
	}
	for name := range e.Xattrs {
		if !keepXattr(name) {
			return fmt.Errorf("%w: %s: extended attribute %q not carried by streams", ErrProtocol, e.Path, name)
		}
	}
	if (e.Major != 0 || e.Minor != 0) && e.Type != entryCharDev && e.Type != entryBlockDev {
		return fmt.Errorf("%w: %s: device numbers on a %s", ErrProtocol, e.Path, e.Type)
	}
	if !d.gotRoot {
		if e.Path != "." || e.Type != entryDir {
			return fmt.Errorf("%w: first entry %q (%s) is not the root directory", ErrProtocol, e.Path, e.Type)
		}
		d.gotRoot = true
		d.dirs["."] = e
		d.order = append(d.order, ".")
		return nil
	}
	if e.Path == "." {
		return fmt.Errorf("%w: second root entry", ErrProtocol)
	}
	if _, ok := d.dirs[path.Dir(e.Path)]; !ok {
		return fmt.Errorf("%w: %q: parent is not a directory received before it", ErrUnsafePath, e.Path)
	}
	full := d.full(e.Path)
	switch e.Type {
	case entryDir:
		if err := os.Mkdir(full, 0o700); err != nil {
			return err
		}
		d.dirs[e.Path] = e
		d.order = append(d.order, e.Path)
	case entryFile:
		// O_EXCL: an entry never replaces what an earlier one made.
		f, err := os.OpenFile(full, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		d.file, d.fileEnt = &fileSink{f: f}, e
		d.nondirs[e.Path] = true
	case entrySymlink:
		if e.Target == "" || strings.IndexByte(e.Target, 0) >= 0 {
			return fmt.Errorf("%w: %s: bad symlink target %q", ErrProtocol, e.Path, e.Target)
		}
		if err := os.Symlink(e.Target, full); err != nil {
			return err
		}
		d.nondirs[e.Path] = true
		return d.applyMeta(e)
	case entryCharDev, entryBlockDev, entryFIFO, entrySocket:
		if err := linux.Mknod(full, specialTypes[e.Type], 0o600, e.Major, e.Minor); err != nil {
			return fmt.Errorf("create %s: %w", e.Type, err)
		}
		d.nondirs[e.Path] = true
		return d.applyMeta(e)
	case entryHardlink:
		// The target is an earlier non-directory of this tree, so the link
		// can neither leave it nor replace anything.
		if err := checkPath(e.Target); err != nil {
			return fmt.Errorf("hard link %s: %w", e.Path, err)
		}
		if !d.nondirs[e.Target] {
			return fmt.Errorf("%w: hard link %s to %q, which is not a non-directory received before it", ErrUnsafePath, e.Path, e.Target)
		}
		if err := os.Link(d.full(e.Target), full); err != nil {
			return err
		}
		d.nondirs[e.Path] = true
	default:
		return fmt.Errorf("%w: %s: unknown entry type %q", ErrProtocol, e.Path, e.Type)
	}
	return nil
}

func (d *dirSink) write(p []byte) error {
	if d.file == nil {
		return fmt.Errorf("%w: data outside a file", ErrProtocol)
	}
	return d.file.write(p)
}

func (d *dirSink) zeros(n int) error {
	if d.file == nil {
		return fmt.Errorf("%w: data outside a file", ErrProtocol)
	}
	return d.file.zeros(n)
}

func (d *dirSink) closeFile() error {
	if d.file == nil {
		return nil
	}
	f := d.file
	d.file = nil
	if err := f.close(); err != nil {
		return err
	}
	return d.applyMeta(d.fileEnt)
}

// finish completes the tree and renames it to dst.
func (d *dirSink) finish(dst string) error {
	if err := d.closeFile(); err != nil {
		return err
	}
	if !d.gotRoot {
		return fmt.Errorf("%w: stream had no root entry", ErrProtocol)
	}
	// Children before parents, so a read-only parent is set last.
	for _, p := range slices.Backward(d.order) {
		if err := d.applyMeta(d.dirs[p]); err != nil {
			return err
		}
	}
	if err := os.Rename(d.root, dst); err != nil {
		return err
	}
	d.root = ""
	return nil
}

// discard removes the partial tree.
func (d *dirSink) discard() error {
	var err error
	if d.file != nil {
		err = d.file.f.Close()
		d.file = nil
	}
	if d.root != "" {
		err = errors.Join(err, os.RemoveAll(d.root))
		d.root = ""
	}
	return err
}

// fileSink writes into a file, turning zero runs into holes.
type fileSink struct {
	f       *os.File
	size    int64
	holeEnd bool // the file ends in a hole not yet materialised
}

func (s *fileSink) entry(entry) error {
	return fmt.Errorf("%w: entry in an object stream", ErrProtocol)
}

func (s *fileSink) write(p []byte) error {
	_, err := s.f.Write(p)
	s.size += int64(len(p))
	s.holeEnd = false
	return err
}

func (s *fileSink) zeros(n int) error {
	_, err := s.f.Seek(int64(n), io.SeekCurrent)
	s.size += int64(n)
	s.holeEnd = true
	return err
}

// close gives a trailing hole its length and closes the file.
func (s *fileSink) close() error {
	var err error
	if s.holeEnd {
		err = s.f.Truncate(s.size)
	}
	return errors.Join(err, s.f.Close())
}

// writerSink writes into an io.Writer; zero runs are written out.
type writerSink struct{ w io.Writer }

func (s writerSink) entry(entry) error {
	return fmt.Errorf("%w: entry in an object stream", ErrProtocol)
}

func (s writerSink) write(p []byte) error {
	_, err := s.w.Write(p)
	return err
}

func (s writerSink) zeros(n int) error {
	for n > 0 {
		m := min(n, len(zeros))
		if _, err := s.w.Write(zeros[:m]); err != nil {
			return err
		}
		n -= m
	}
	return nil
}

func removeIfExists(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
