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
// last one. The caller's methods are not safe for concurrent use; close
// waits for the goroutine.
type imageWriter struct {
	f     *os.File
	hash  pageHasher  // the source's, for the digest
	cur   []byte      // being filled
	free  chan []byte // buffers to fill
	full  chan []byte // buffers to hash and write, in order
	done  chan error  // the goroutine's result, once full is closed
	sum   uint64      // the digest, valid after close
	pages uint32
}

func newImageWriter(f *os.File, hash pageHasher) *imageWriter {
	w := &imageWriter{
		f:    f,
		hash: hash,
		free: make(chan []byte, 2),
		full: make(chan []byte, 2),
		done: make(chan error, 1),
	}
	for range 2 {
		w.free <- make([]byte, 0, imageWriterBuf)
	}
	w.cur = <-w.free
	go w.run()
	return w
}

func (w *imageWriter) run() {
	var err error
	d := xxhash.New()
	var hb [8]byte
	for buf := range w.full {
		if err == nil {
			for off := 0; off < len(buf); off += PageSize {
				binary.LittleEndian.PutUint64(hb[:], w.hash.sum(buf[off:off+PageSize]))
				d.Write(hb[:])
			}
			_, err = w.f.Write(buf)
		}
		w.free <- buf[:0]
	}
	w.sum = d.Sum64()
	w.done <- err
}

// space returns the free part of the current buffer, at least one page,
// handing the buffer over first if it is full.
func (w *imageWriter) space() []byte {
	if len(w.cur) == cap(w.cur) {
		w.full <- w.cur
		w.cur = <-w.free
	}
	return w.cur[len(w.cur):cap(w.cur)]
}

// commit adds n bytes (whole pages) written into space to the image.
func (w *imageWriter) commit(n int) {
	w.cur = w.cur[:len(w.cur)+n]
	w.pages += uint32(n / PageSize)
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
	if len(w.cur) > 0 {
		w.full <- w.cur
	}
	close(w.full)
	err := <-w.done
	return errors.Join(err, w.f.Close())
}
