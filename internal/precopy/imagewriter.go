package precopy

import (
	"encoding/binary"
	"errors"
	"os"

	"github.com/cespare/xxhash/v2"
)

// imageWriterBuf is the size of the buffers an imageWriter fills.
const imageWriterBuf = 4 << 20

// imageWriter writes a pages image in two stages: the caller fills
// buffers (reading held pages straight into them), and a goroutine of
// its own hashes each full buffer's pages into the image digest and
// writes it, so filling the next buffer overlaps hashing and writing the
// last one. Pages added with keep are not written, and count in the
// digest by the hashes the caller gives: the image's pagemap finds them
// in the parent directory (the store). The caller's methods are not
// safe for concurrent use; close waits for the goroutine. Its two
// buffers are the caller's, handed back by buffers after close for the
// next image: allocating them anew for every image would cost page
// faults inside the frozen window.
type imageWriter struct {
	f     *os.File
	hash  pageHasher // the source's, for the digest
	cur   *chunk     // being filled
	free  chan *chunk
	full  chan *chunk // to hash and write, in order
	done  chan error  // the goroutine's result, once full is closed
	sum   uint64      // the digest, valid after close
	pages uint32      // in the image, written or kept
}

// chunk is a buffer of pages to write and, in order, the hashes of the
// kept pages among them: kept[i] are sums[from:to], before b[at:].
type chunk struct {
	b    []byte
	sums []uint64
	kept []keptSums
}

type keptSums struct{ at, from, to int }

// newImageWriter writes to f through bufs (nil: allocated here).
func newImageWriter(f *os.File, hash pageHasher, bufs [2][]byte) *imageWriter {
	w := &imageWriter{
		f:    f,
		hash: hash,
		free: make(chan *chunk, 2),
		full: make(chan *chunk, 2),
		done: make(chan error, 1),
	}
	for _, b := range bufs {
		if b == nil {
			b = make([]byte, 0, imageWriterBuf)
		}
		w.free <- &chunk{b: b[:0]}
	}
	w.cur = <-w.free
	go w.run()
	return w
}

func (w *imageWriter) run() {
	var err error
	d := xxhash.New()
	var hb [8]byte
	sum := func(h uint64) {
		binary.LittleEndian.PutUint64(hb[:], h)
		d.Write(hb[:])
	}
	for c := range w.full {
		if err == nil {
			pos := 0
			for _, k := range append(c.kept, keptSums{at: len(c.b)}) {
				for ; pos < k.at; pos += PageSize {
					sum(w.hash.sum(c.b[pos : pos+PageSize]))
				}
				for _, h := range c.sums[k.from:k.to] {
					sum(h)
				}
			}
			if len(c.b) > 0 {
				_, err = w.f.Write(c.b)
			}
		}
		c.b, c.sums, c.kept = c.b[:0], c.sums[:0], c.kept[:0]
		w.free <- c
	}
	w.sum = d.Sum64()
	w.done <- err
}

// space returns the free part of the current buffer, at least one page,
// handing the buffer over first if it is full.
func (w *imageWriter) space() []byte {
	if len(w.cur.b) == cap(w.cur.b) {
		w.full <- w.cur
		w.cur = <-w.free
	}
	return w.cur.b[len(w.cur.b):cap(w.cur.b)]
}

// commit adds n bytes (whole pages) written into space to the image.
func (w *imageWriter) commit(n int) {
	w.cur.b = w.cur.b[:len(w.cur.b)+n]
	w.pages += uint32(n / PageSize)
}

// keep adds pages that stay where they are, by their hashes.
func (w *imageWriter) keep(sums []uint64) {
	c := w.cur
	from := len(c.sums)
	c.sums = append(c.sums, sums...)
	c.kept = append(c.kept, keptSums{at: len(c.b), from: from, to: len(c.sums)})
	w.pages += uint32(len(sums))
}

// write adds whole pages p to the image.
func (w *imageWriter) write(p []byte) {
	for len(p) > 0 {
		n := copy(w.space(), p)
		w.commit(n)
		p = p[n:]
	}
}

// zeros adds n zero pages.
func (w *imageWriter) zeros(n uint32) {
	for left := int(n) * PageSize; left > 0; {
		sp := w.space()
		k := min(len(sp), left)
		clear(sp[:k])
		w.commit(k)
		left -= k
	}
}

// close writes what is buffered, closes the file and returns the first
// error; the digest is then in sum.
func (w *imageWriter) close() error {
	if len(w.cur.b) > 0 || len(w.cur.kept) > 0 {
		w.full <- w.cur
	} else {
		w.free <- w.cur
	}
	w.cur = nil
	close(w.full)
	err := <-w.done
	return errors.Join(err, w.f.Close())
}

// buffers returns the writer's two buffers once close returned.
func (w *imageWriter) buffers() [2][]byte {
	return [2][]byte{(<-w.free).b, (<-w.free).b}
}
