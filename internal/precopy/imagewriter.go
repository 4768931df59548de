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
// waits for the goroutine. Its two buffers are the caller's, handed back
// by buffers after close for the next image: allocating them anew for
// every image would cost page faults inside the frozen window.
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

// newImageWriter writes to f through bufs (nil: allocated here).
func newImageWriter(f *os.File, hash pageHasher, bufs [2][]byte) *imageWriter {
	w := &imageWriter{
		f:    f,
		hash: hash,
		free: make(chan []byte, 2),
		full: make(chan []byte, 2),
		done: make(chan error, 1),
	}
	for _, b := range bufs {
		if b == nil {
			b = make([]byte, 0, imageWriterBuf)
		}
		w.free <- b[:0]
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
	return [2][]byte{<-w.free, <-w.free}
}
