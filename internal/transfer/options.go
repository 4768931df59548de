package transfer

import (
	"fmt"
	"io"
	"io/fs"
	"time"
)

// Compression selects per-chunk zstd compression on the sending side. The
// receiver needs no setting: each frame says whether it is compressed.
type Compression int

const (
	// CompressOff sends chunks as they are.
	CompressOff Compression = iota
	// CompressZstd compresses every chunk (zstd, fastest level) and sends
	// the compressed form whenever it is smaller.
	CompressZstd
	// CompressAuto compresses a probe chunk, measures the ratio and this
	// CPU's compression speed, and keeps compressing only while that moves
	// more raw bytes per second than the link carries uncompressed (see
	// worthCompressing). It re-probes every autoReprobe chunks, so a stream
	// whose content changes from compressible to not (or back) adapts.
	CompressAuto
)

func (c Compression) String() string {
	switch c {
	case CompressOff:
		return "off"
	case CompressZstd:
		return "zstd"
	case CompressAuto:
		return "auto"
	}
	return fmt.Sprintf("compression(%d)", int(c))
}

// ParseCompression accepts "off", "zstd" and "auto".
func ParseCompression(s string) (Compression, error) {
	for _, c := range []Compression{CompressOff, CompressZstd, CompressAuto} {
		if s == c.String() {
			return c, nil
		}
	}
	return 0, fmt.Errorf("unknown compression %q (want off, zstd or auto)", s)
}

// Defaults for SendOptions.
const (
	DefaultChunkSize = 1 << 20
	// DefaultLinkBitsPerSecond is the link rate CompressAuto assumes when
	// none is declared: the testbed's usual 1 Gbit/s edge link.
	DefaultLinkBitsPerSecond = 1_000_000_000
	// DefaultDepth is how many chunks the reader may run ahead of the
	// network.
	DefaultDepth = 4
	minChunkSize = 4 << 10
)

// SendOptions tune one outgoing stream. The zero value sends 1 MiB chunks
// uncompressed.
type SendOptions struct {
	// Name labels the stream; the receiver sees it in Stats.Name.
	Name string
	// Compression selects per-chunk compression.
	Compression Compression
	// LinkBitsPerSecond is the rate of the link the stream crosses, used
	// by CompressAuto; zero means DefaultLinkBitsPerSecond.
	LinkBitsPerSecond int64
	// ChunkSize is the data frame size, 4 KiB to MaxChunkSize; zero means
	// DefaultChunkSize.
	ChunkSize int
	// Depth is how many chunks reading may run ahead of sending; zero
	// means DefaultDepth.
	Depth int
	// Overlay makes SendDir copy a tree with everything an overlayfs upper
	// layer needs to round-trip exactly: character and block device nodes
	// (whiteouts are character devices 0:0), FIFOs and sockets, hard links
	// (each inode sent once, linked again on the receiver) and extended
	// attributes (trusted.*, user.*, security.capability and POSIX ACLs,
	// so opaque directories and overlayfs' other markers survive).
	// Without it SendDir refuses special files and sends each hard link
	// as a separate file. The receiver needs no setting; it creates device
	// nodes and trusted.* attributes only when it runs as root.
	Overlay bool
	// Live says the tree changes while it is sent (a running container's
	// writable layer): an entry removed between being listed and being
	// read is left out instead of failing the stream. A file that shrinks
	// while read is sent as read; the caller sends the changes later.
	Live bool
	// Tee, when set, sees what SendDir sends of each regular file: it is
	// called with the file's path in the tree (slash-separated) and its
	// information as listed, and the writer it returns (nil: none)
	// receives the bytes read, exactly as sent (a live file may change
	// while read). It runs on the stream's reading goroutine.
	Tee func(rel string, info fs.FileInfo) io.Writer
}

func (o SendOptions) withDefaults() (SendOptions, error) {
	if o.ChunkSize == 0 {
		o.ChunkSize = DefaultChunkSize
	}
	if o.LinkBitsPerSecond == 0 {
		o.LinkBitsPerSecond = DefaultLinkBitsPerSecond
	}
	if o.Depth == 0 {
		o.Depth = DefaultDepth
	}
	switch {
	case o.ChunkSize < minChunkSize || o.ChunkSize > MaxChunkSize:
		return o, fmt.Errorf("chunk size %d outside [%d, %d]", o.ChunkSize, minChunkSize, MaxChunkSize)
	case o.LinkBitsPerSecond < 0:
		return o, fmt.Errorf("negative link rate %d", o.LinkBitsPerSecond)
	case o.Depth < 1:
		return o, fmt.Errorf("pipeline depth %d < 1", o.Depth)
	case o.Compression < CompressOff || o.Compression > CompressAuto:
		return o, fmt.Errorf("unknown compression %d", o.Compression)
	}
	return o, nil
}

// RecvOptions tune one incoming stream. The zero value accepts any size.
type RecvOptions struct {
	// MaxBytes, when positive, rejects a stream whose content exceeds it
	// with ErrTooLarge (protects a tmpfs from a runaway sender).
	MaxBytes int64
}

// Stats accounts for one stream. Sender and receiver fill the same fields
// from what they sent and received; the receiver has checked that its
// counts and digest equal the sender's.
type Stats struct {
	// Name is the stream's label (SendOptions.Name).
	Name string
	// Files, Dirs and Symlinks count directory entries, the root included
	// in Dirs. A single-object stream has none.
	Files, Dirs, Symlinks int64
	// Specials counts device nodes (whiteouts included), FIFOs and
	// sockets; Hardlinks counts names that were sent as links to an
	// earlier entry. Both stay zero without SendOptions.Overlay.
	Specials, Hardlinks int64
	// EarlyFiles counts the files SendDirAsWritten sent as they were
	// named, before the directory was complete.
	EarlyFiles int64
	// PayloadBytes is the content moved: file or object bytes before
	// compression, holes included.
	PayloadBytes int64
	// WireBytes is what this protocol put on the connection: frames with
	// their headers, after compression. TLS adds about 22 bytes per 16 KiB
	// record on top (0.13%).
	WireBytes int64
	// Chunks counts data frames, of which CompressedChunks went compressed
	// and ZeroChunks were all zeros and went as a length only.
	Chunks, CompressedChunks, ZeroChunks int64
	// CompressedBytes and ZeroBytes are the raw sizes of the chunks that
	// went compressed and of those that went as zeros.
	CompressedBytes, ZeroBytes int64
	// Compression is the mode the sender asked for; Compressed says
	// whether most of the non-zero payload went compressed (auto
	// compresses a probe chunk now and then even when it leaves
	// compression off; that is not a compressed stream).
	Compression Compression
	Compressed  bool
	// AutoNote explains the last CompressAuto decision (sender only).
	AutoNote string
	// Duration runs from the stream's first frame to its last. The sender's
	// ends when the last frame is handed to the kernel, so it can be shorter
	// than the receiver's by up to the socket buffers' drain time.
	Duration time.Duration
	// Digest is the xxhash64 of the stream's content in order (entries as
	// sent, data bytes, zero runs as their length).
	Digest uint64
}

// Goodput is payload bytes per second over Duration.
// mostlyCompressed is what Compressed says, the same on both ends.
func (s Stats) mostlyCompressed() bool {
	return 2*s.CompressedBytes > s.PayloadBytes-s.ZeroBytes
}

func (s Stats) Goodput() float64 {
	if s.Duration <= 0 {
		return 0
	}
	return float64(s.PayloadBytes) / s.Duration.Seconds()
}

// String summarises s on one line for logs.
func (s Stats) String() string {
	return fmt.Sprintf("%d files, %d dirs, %d symlinks, %d specials, %d hard links, %d payload bytes, %d wire bytes, %d chunks (%d compressed, %d zero), %v, %.1f MB/s",
		s.Files, s.Dirs, s.Symlinks, s.Specials, s.Hardlinks, s.PayloadBytes, s.WireBytes, s.Chunks, s.CompressedChunks, s.ZeroChunks,
		s.Duration.Round(time.Microsecond), s.Goodput()/1e6)
}
