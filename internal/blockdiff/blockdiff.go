package blockdiff

import (
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"io/fs"
	"sync"
)

const (
	// BlockSize is the unit a changed file is compared and sent in.
	BlockSize = 64 << 10
	// MinSize is the smallest file an Index records: smaller ones are
	// sent whole.
	MinSize = 1 << 20
	// maxRanges bounds a Patch's ranges: a file of MaxSize changed in
	// every other block.
	maxRanges = 1 << 20
)

// Range is a run of bytes of a file.
type Range struct {
	Off int64 `json:"off"`
	Len int64 `json:"len"`
}

// Patch turns the receiver's copy of the file at Path into the sender's:
// the bytes of each range (sent in order) replace the copy's, and the
// file is then cut (or extended with zeros) to Size.
type Patch struct {
	Path   string  `json:"path"`
	Size   int64   `json:"size"`
	Ranges []Range `json:"ranges,omitempty"`
}

// DataLen is the length of the patch's data: its ranges' total.
func (p Patch) DataLen() int64 {
	var n int64
	for _, r := range p.Ranges {
		n += r.Len
	}
	return n
}

// Check validates a patch from a peer: a clean relative path, a size
// within maxSize, and ranges that are non-empty, in order, apart and
// within the size.
func (p Patch) Check(maxSize int64) error {
	if p.Path == "." || !fs.ValidPath(p.Path) {
		return fmt.Errorf("patch: bad path %q", p.Path)
	}
	if p.Size < 0 || p.Size > maxSize {
		return fmt.Errorf("patch %s: size %d outside 0..%d", p.Path, p.Size, maxSize)
	}
	if len(p.Ranges) > maxRanges {
		return fmt.Errorf("patch %s: %d ranges, at most %d", p.Path, len(p.Ranges), maxRanges)
	}
	var end int64
	for i, r := range p.Ranges {
		if r.Len <= 0 || r.Off < end || r.Off > p.Size-r.Len {
			return fmt.Errorf("patch %s: range %d (%d+%d) empty, out of order or past the size %d", p.Path, i, r.Off, r.Len, p.Size)
		}
		end = r.Off + r.Len
	}
	return nil
}

// File is the file a Patch applies to (an *os.File).
type File interface {
	io.WriterAt
	Truncate(size int64) error
}

// Apply applies p (checked) to f, reading its data from data.
func Apply(f File, p Patch, data io.Reader) error {
	for _, r := range p.Ranges {
		n, err := io.CopyN(io.NewOffsetWriter(f, r.Off), data, r.Len)
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("patch %s at %d (%d of %d bytes): %w", p.Path, r.Off, n, r.Len, err)
		}
	}
	if err := f.Truncate(p.Size); err != nil {
		return fmt.Errorf("patch %s: %w", p.Path, err)
	}
	return nil
}

// Index records the blocks of files as they are sent.
type Index struct {
	seed  maphash.Seed
	mu    sync.Mutex
	files map[string]*summer
}

// NewIndex returns an empty index with a fresh seed.
func NewIndex() *Index {
	return &Index{seed: maphash.MakeSeed(), files: map[string]*summer{}}
}

// Writer returns the writer that records the content of the file at rel
// as sent, replacing any earlier record, or nil when size (as listed) is
// below MinSize.
func (x *Index) Writer(rel string, size int64) io.Writer {
	if x == nil || size < MinSize {
		return nil
	}
	s := &summer{seed: x.seed}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.files[rel] = s
	return s
}

// Forget drops the record of rel: it is sent whole next time.
func (x *Index) Forget(rel string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	delete(x.files, rel)
}

// Diff reads the current content of the file at rel from r and returns
// the patch that turns what was sent of it into that content; ok is
// false when nothing of rel was recorded.
func (x *Index) Diff(rel string, r io.Reader) (p Patch, ok bool, err error) {
	if x == nil {
		return Patch{}, false, nil
	}
	x.mu.Lock()
	s := x.files[rel]
	x.mu.Unlock()
	if s == nil {
		return Patch{}, false, nil
	}
	sums := s.sums()
	p.Path = rel
	buf := make([]byte, BlockSize)
	for i := 0; ; i++ {
		n, err := io.ReadFull(r, buf)
		if n > 0 {
			if i >= len(sums) || sums[i] != maphash.Bytes(x.seed, buf[:n]) {
				p.add(p.Size, int64(n))
			}
			p.Size += int64(n)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return p, true, nil
		}
		if err != nil {
			return Patch{}, false, fmt.Errorf("diff %s: %w", rel, err)
		}
	}
}

// add appends a changed run, merged with the last one when they touch.
func (p *Patch) add(off, n int64) {
	if k := len(p.Ranges); k > 0 && p.Ranges[k-1].Off+p.Ranges[k-1].Len == off {
		p.Ranges[k-1].Len += n
		return
	}
	p.Ranges = append(p.Ranges, Range{Off: off, Len: n})
}

// summer hashes what it is written block by block.
type summer struct {
	seed maphash.Seed
	mu   sync.Mutex
	full []uint64 // the sums of the full blocks
	tail []byte   // the bytes after them
}

func (s *summer) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(b)
	if len(s.tail) > 0 {
		k := min(BlockSize-len(s.tail), len(b))
		s.tail = append(s.tail, b[:k]...)
		b = b[k:]
		if len(s.tail) < BlockSize {
			return n, nil
		}
		s.full = append(s.full, maphash.Bytes(s.seed, s.tail))
		s.tail = s.tail[:0]
	}
	for len(b) >= BlockSize {
		s.full = append(s.full, maphash.Bytes(s.seed, b[:BlockSize]))
		b = b[BlockSize:]
	}
	if len(b) > 0 {
		if s.tail == nil {
			s.tail = make([]byte, 0, BlockSize)
		}
		s.tail = append(s.tail, b...)
	}
	return n, nil
}

// sums returns a block sum per block written, the last possibly short.
func (s *summer) sums() []uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.full[:len(s.full):len(s.full)]
	if len(s.tail) > 0 {
		out = append(out, maphash.Bytes(s.seed, s.tail))
	}
	return out
}
