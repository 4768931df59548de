package precopy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/transfer"
)

// Errors callers branch on.
var (
	// ErrBroken means a stream failed part-way, so what the destination
	// holds is unknown: the Source refuses further rounds and the final
	// delta. The migration must fall back to sending the whole dump.
	ErrBroken = errors.New("precopy: destination state unknown after a failed stream")
	// ErrNotSupported means this machine or directory cannot do live
	// pre-copy (see the wrapped reason).
	ErrNotSupported = errors.New("precopy: not supported")
	// ErrMismatch means a rebuilt pages image does not have the dump's
	// digest (a hash collision, or a bug): the rebuilt images must not be
	// restored.
	ErrMismatch = errors.New("precopy: rebuilt pages image differs from the dump")
)

// DefaultBatchBytes is how much memory a round reads per process_vm_readv.
const DefaultBatchBytes = 4 << 20

// Config configures a Source.
type Config struct {
	// Pid is the root of the process tree to copy (a container's init),
	// in this process's pid namespace. Its descendants are found again
	// every round.
	Pid int
	// BatchBytes is how much memory one process_vm_readv call reads: a
	// multiple of PageSize; 0 means DefaultBatchBytes.
	BatchBytes int
	// Send tunes the streams (compression, link rate); Name is set by
	// the Source.
	Send transfer.SendOptions
	// ShadowBytes bounds the copies the Source keeps of the pages it
	// sent, to send their next change as an XOR (shadow.go); 0 means
	// DefaultShadowBytes, negative keeps none.
	ShadowBytes int64
	// Logger receives a line per round; nil discards.
	Logger *slog.Logger
	// Now is the clock Rounds checks StopRule.Deadline against; nil
	// means time.Now.
	Now func() time.Time
}

// Validate reports what is wrong with c.
func (c Config) Validate() error {
	var errs []error
	if c.Pid <= 0 {
		errs = append(errs, fmt.Errorf("pid %d", c.Pid))
	}
	if c.BatchBytes < 0 || c.BatchBytes%PageSize != 0 {
		errs = append(errs, fmt.Errorf("batch of %d bytes is not a multiple of %d", c.BatchBytes, PageSize))
	}
	return errors.Join(errs...)
}

// pageLoc is a page's address in one process: the key under which the
// destination stores it.
type pageLoc struct {
	pid  uint32
	addr uint64
}

// Source reads a running process tree's memory and sends it in rounds,
// then sends the final delta against a CRIU dump. It is not safe for
// concurrent use.
type Source struct {
	cfg Config
	log *slog.Logger

	// hash hashes pages under this migration's secret key; zeroHash is
	// the zero page's.
	hash     pageHasher
	zeroHash uint64
	// held maps nspid → page number → hash of the page the destination
	// holds there, exactly as the streams sent so far left it.
	held map[uint32]map[uint64]uint64
	// index maps a (non-zero) page hash to a location that held it when
	// recorded; used only after checking held still says so.
	index map[uint64]pageLoc
	// shadow holds, up to a bound, what the destination holds of the
	// pages sent, the pages that changed after the first round first.
	shadow *shadows
	// rounds counts rounds started.
	rounds int
	// err is sticky: set when a stream failed, or after the final delta.
	err error

	buf    []byte
	xbuf   [PageSize]byte // encodeData's XOR
	ranges []linux.MemRange
}

// NewSource prepares the rounds for the tree rooted at cfg.Pid. It
// reads nothing yet.
func NewSource(cfg Config) (*Source, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("precopy source: %w", err)
	}
	if ps := os.Getpagesize(); ps != PageSize {
		return nil, fmt.Errorf("%w: page size %d, want %d", ErrNotSupported, ps, PageSize)
	}
	if cfg.BatchBytes == 0 {
		cfg.BatchBytes = DefaultBatchBytes
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.ShadowBytes == 0 {
		cfg.ShadowBytes = DefaultShadowBytes
	}
	h := newPageHasher()
	return &Source{
		cfg: cfg, log: log,
		hash: h, zeroHash: h.sum(zeroPage[:]),
		held:   map[uint32]map[uint64]uint64{},
		index:  map[uint64]pageLoc{},
		shadow: newShadows(cfg.ShadowBytes),
		buf:    make([]byte, cfg.BatchBytes),
	}, nil
}

// HeldPages is how many pages the destination holds according to the
// streams sent so far.
func (s *Source) HeldPages() int {
	n := 0
	for _, m := range s.held {
		n += len(m)
	}
	return n
}

// RoundStats describes one live round.
type RoundStats struct {
	Round     int
	Processes int
	// Pages were read (the tree's resident anonymous memory), Changed of
	// them differed from what the destination held and were sent: as
	// data, as a zero flag, or as a copy of a page it holds elsewhere.
	// XorPages of the DataPages went as their XOR with what the
	// destination held.
	Pages, Changed                  int64
	DataPages, ZeroPages, CopyPages int64
	XorPages                        int64
	// Skipped pages could not be read (unmapped during the round).
	Skipped int64
	// Bytes went on the wire (frames included, before TLS).
	Bytes int64
	// ReadTime was spent in process_vm_readv; Duration is the whole round.
	ReadTime, Duration time.Duration
}

// ChangedBytes is the memory the round found changed.
func (r RoundStats) ChangedBytes() int64 { return r.Changed * PageSize }

// ReadThroughput is bytes read per second of process_vm_readv.
func (r RoundStats) ReadThroughput() float64 {
	if r.ReadTime <= 0 {
		return 0
	}
	return float64(r.Pages*PageSize) / r.ReadTime.Seconds()
}

// Round reads the whole tree once and sends, as one stream on conn, every
// page whose content differs from what the destination holds; the peer
// calls Store.ReceiveRound. The process tree keeps running: pages it
// writes during the round may go in a state that is already stale, which
// the next round or the final delta corrects. A failed stream makes the
// Source unusable (ErrBroken).
func (s *Source) Round(ctx context.Context, conn *transfer.Conn) (RoundStats, error) {
	if s.err != nil {
		return RoundStats{}, s.err
	}
	procs, err := processTree(s.cfg.Pid)
	if err != nil {
		return RoundStats{}, fmt.Errorf("precopy round: %w", err)
	}
	s.rounds++
	start := time.Now()
	rr := &roundReader{s: s, ctx: ctx, procs: procs}
	rr.st.Round, rr.st.Processes = s.rounds, len(procs)
	opts := s.cfg.Send
	opts.Name = fmt.Sprintf("precopy-round-%d", s.rounds)
	tst, err := conn.SendStream(ctx, rr, opts)
	st := rr.st
	st.Bytes, st.Duration = tst.WireBytes, time.Since(start)
	if err != nil {
		s.err = fmt.Errorf("%w: round %d: %w", ErrBroken, s.rounds, err)
		return st, s.err
	}
	s.log.Debug("precopy round", "round", st.Round, "processes", st.Processes, "pages", st.Pages,
		"changed", st.Changed, "data", st.DataPages, "xor", st.XorPages, "zero", st.ZeroPages, "copy", st.CopyPages,
		"skipped", st.Skipped, "wire_bytes", st.Bytes, "read_ms", st.ReadTime.Milliseconds(),
		"ms", st.Duration.Milliseconds())
	return st, nil
}

// Rounds runs live rounds on conn until rule says to stop, and returns
// every round's statistics and the reason. Before each round it calls
// announce with the round's number (from 1), for the caller to tell the
// destination that a round follows (it then calls Store.ReceiveRound);
// after the last round the caller freezes the container, dumps it and
// calls SendFinal. An error from announce or a round ends the rounds with
// that error; after a round's error the Source is unusable (ErrBroken).
func (s *Source) Rounds(ctx context.Context, conn *transfer.Conn, rule StopRule, announce func(ctx context.Context, round int) error) ([]RoundStats, StopReason, error) {
	if err := rule.Validate(); err != nil {
		return nil, "", fmt.Errorf("precopy rounds: %w", err)
	}
	var history []RoundStats
	for {
		if err := announce(ctx, s.rounds+1); err != nil {
			return history, "", err
		}
		st, err := s.Round(ctx, conn)
		if err != nil {
			return history, "", err
		}
		history = append(history, st)
		if why, stop := ShouldStop(history, rule, s.cfg.Now()); stop {
			return history, why, nil
		}
	}
}

var zeroPage [PageSize]byte

// isZeroPage reports whether p, whose hash is h, is all zeros.
func (s *Source) isZeroPage(p []byte, h uint64) bool {
	return h == s.zeroHash && bytes.Equal(p, zeroPage[:])
}

// copySource returns a location other than self at which the destination
// holds content hashed h, if the index knows one.
func (s *Source) copySource(h uint64, self pageLoc) (pageLoc, bool) {
	loc, ok := s.index[h]
	if !ok || loc == self {
		return pageLoc{}, false
	}
	if got, ok := s.held[loc.pid][loc.addr/PageSize]; !ok || got != h {
		delete(s.index, h)
		return pageLoc{}, false
	}
	return loc, true
}

// roundReader produces one round's stream as SendStream reads it: each
// time its buffer is drained it reads the next batch of memory, hashes
// it and encodes what changed.
type roundReader struct {
	s     *Source
	ctx   context.Context
	procs []process
	st    RoundStats

	enc   encoder
	off   int // read position in enc.buf
	begun bool
	done  bool

	// The process being read and its remaining ranges.
	cur    int // index in procs of the next process to open
	proc   *process
	ranges []linux.MemRange
}

func (r *roundReader) Read(p []byte) (int, error) {
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

// produce appends the next piece of the stream to r.enc.buf.
func (r *roundReader) produce() error {
	switch {
	case !r.begun:
		r.begun = true
		r.enc.single(roundBegin(&r.s.hash, r.st.Round))
	case r.proc != nil && len(r.ranges) > 0:
		return r.readBatch()
	case r.cur < len(r.procs):
		return r.open(&r.procs[r.cur])
	default:
		r.enc.single(record{typ: recEnd, addr: r.enc.pages, saddr: r.enc.records})
		r.done = true
	}
	return nil
}

// open finds the pages of the next process. A process that has exited
// is skipped.
func (r *roundReader) open(p *process) error {
	r.cur++
	r.proc, r.ranges = nil, nil
	ranges, err := dataRanges(p.pid, r.s.ranges[:0])
	r.s.ranges = ranges
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, linux.ErrNoProcess) {
			r.s.log.Debug("process gone", "pid", p.pid)
			return nil
		}
		return err
	}
	r.proc, r.ranges = p, ranges
	return nil
}

// dataRanges lists the pages of pid that CRIU would dump.
func dataRanges(pid int, dst []linux.MemRange) ([]linux.MemRange, error) {
	maps, err := dataMappings(pid)
	if err != nil {
		return dst, err
	}
	pm, err := linux.OpenPagemap(pid)
	if err != nil {
		return dst, err
	}
	defer pm.Close()
	for _, m := range maps {
		if m.shared {
			// Every page of the shared object CRIU will dump, not only
			// those this process has mapped; the pagemap when the
			// object cannot be opened.
			n := len(dst)
			if dst, err = linux.ShmemDataRanges(pid, m.Start, m.End, m.offset, dst); err == nil {
				continue
			}
			if exited(err) {
				return dst, err
			}
			dst = dst[:n]
		}
		if dst, err = pm.DataRanges(m.Start, m.End, m.shared, dst); err != nil {
			return dst, fmt.Errorf("pages of %d: %w", pid, err)
		}
	}
	return dst, nil
}

// readBatch reads the next batch of the current process's pages and
// encodes the changed ones.
func (r *roundReader) readBatch() error {
	s := r.s
	batch := make([]linux.MemRange, 0, linux.MaxIOV)
	var total uint64
	budget := uint64(len(s.buf))
	for i := 0; i < len(r.ranges) && len(batch) < linux.MaxIOV && total < budget; i++ {
		rg := r.ranges[i]
		if rg.Len() > budget-total {
			rg.End = rg.Start + (budget - total)
		}
		batch = append(batch, rg)
		total += rg.Len()
	}
	t0 := time.Now()
	n, err := linux.ReadProcessMemory(r.proc.pid, s.buf, batch)
	r.st.ReadTime += time.Since(t0)
	if err != nil {
		if errors.Is(err, linux.ErrNoProcess) {
			r.proc, r.ranges = nil, nil
			return nil
		}
		return err
	}
	got := uint64(n) / PageSize * PageSize
	// Encode the pages read.
	off := uint64(0)
	for _, rg := range batch {
		for a := rg.Start; a < rg.End && off < got; a += PageSize {
			r.page(a, s.buf[off:off+PageSize])
			off += PageSize
		}
	}
	r.enc.flush()
	// Advance past what was read; on a short read skip the rest of the
	// range that failed (it was most likely unmapped).
	for got > 0 && len(r.ranges) > 0 {
		l := r.ranges[0].Len()
		if l > got {
			r.ranges[0].Start += got
			break
		}
		got -= l
		r.ranges = r.ranges[1:]
	}
	if uint64(n) < total && len(r.ranges) > 0 {
		r.st.Skipped += int64(r.ranges[0].Len() / PageSize)
		r.ranges = r.ranges[1:]
	}
	return nil
}

// page encodes one page read at addr if the destination holds something
// else there.
func (r *roundReader) page(addr uint64, data []byte) {
	s, nspid := r.s, r.proc.nspid
	r.st.Pages++
	h := s.hash.sum(data)
	m := s.held[nspid]
	if m == nil {
		m = map[uint64]uint64{}
		s.held[nspid] = m
	}
	old, held := m[addr/PageSize]
	if held && old == h {
		return
	}
	r.st.Changed++
	self := pageLoc{nspid, addr}
	// The shadows keep what the destination now holds (a zero page
	// needs no copy).
	switch src, ok := s.copySource(h, self); {
	case s.isZeroPage(data, h):
		r.st.ZeroPages++
		r.enc.page(recZero, nspid, addr, 0, 0, nil)
		s.shadow.drop(self)
	case ok:
		r.st.CopyPages++
		r.enc.page(recCopy, nspid, addr, src.pid, src.addr, nil)
		s.shadow.share(self, src, h)
	default:
		r.st.DataPages++
		if s.encodeData(&r.enc, self, old, held, data) {
			r.st.XorPages++
		}
		s.index[h] = self
		s.shadow.put(self, h, data, r.st.Round > 1)
	}
	m[addr/PageSize] = h
}

// encodeData encodes data, a page that changed at loc (pid 0: a page
// without an address), as its XOR with the page the destination holds
// there (hashed old, if held) when that is better sent (xorIfWorth), as
// data otherwise; it reports whether it went as an XOR.
func (s *Source) encodeData(enc *encoder, loc pageLoc, old uint64, held bool, data []byte) bool {
	if held && loc.pid != 0 {
		if base := s.shadow.get(loc, old); base != nil && xorIfWorth(s.xbuf[:], data, base) {
			enc.xor(loc.pid, loc.addr, s.xbuf[:])
			return true
		}
	}
	enc.page(recData, loc.pid, loc.addr, 0, 0, data)
	return false
}
