package transfer

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"

	"github.com/cespare/xxhash/v2"
)

// Stream kinds in streamHeader.Kind.
const (
	streamDir    = "dir"
	streamObject = "object"
)

// streamHeader is the payload of a stream's first frame.
type streamHeader struct {
	Kind        string `json:"kind"`
	Name        string `json:"name,omitempty"`
	Compression string `json:"compression"`
	// Mode is the file mode of an object sent by SendFile (0 otherwise).
	Mode uint32 `json:"mode,omitempty"`
}

// Entry types in entry.Type.
const (
	entryDir     = "dir"
	entryFile    = "file"
	entrySymlink = "symlink"
)

// entry describes one directory-tree member. Data frames that follow a
// file entry are that file's content, up to the next entry or the end.
type entry struct {
	// Path is slash-separated and relative to the tree's root; "." is the
	// root itself, always the first entry. Parents come before children.
	Path string `json:"path"`
	Type string `json:"type"`
	// Mode holds permission, setuid, setgid and sticky bits (os.FileMode).
	Mode   uint32 `json:"mode"`
	Target string `json:"target,omitempty"`
	// UID and GID own the entry; a receiver running as root applies them.
	UID int `json:"uid"`
	GID int `json:"gid"`
	// MTime is the modification time in Unix nanoseconds (not applied to
	// symlinks).
	MTime int64 `json:"mtime"`
}

const modeMask = os.ModePerm | os.ModeSetuid | os.ModeSetgid | os.ModeSticky

// summary is the payload of a stream's last frame.
type summary struct {
	Files    int64  `json:"files"`
	Dirs     int64  `json:"dirs"`
	Symlinks int64  `json:"symlinks"`
	Bytes    int64  `json:"bytes"`
	Chunks   int64  `json:"chunks"`
	Digest   string `json:"digest"`
}

func summaryOf(s Stats) summary {
	return summary{
		Files: s.Files, Dirs: s.Dirs, Symlinks: s.Symlinks,
		Bytes: s.PayloadBytes, Chunks: s.Chunks,
		Digest: fmt.Sprintf("%016x", s.Digest),
	}
}

// abortMsg is the payload of an abort frame.
type abortMsg struct {
	Error string `json:"error"`
}

// contentDigest is the stream digest both sides compute: each piece is
// tagged so that an entry, data and a zero run cannot be confused.
type contentDigest struct{ h *xxhash.Digest }

func newContentDigest() contentDigest { return contentDigest{xxhash.New()} }

func (d contentDigest) entry(payload []byte) {
	d.h.Write([]byte{'E'})
	d.h.Write(payload)
}

func (d contentDigest) data(p []byte) {
	d.h.Write([]byte{'D'})
	d.h.Write(p)
}

func (d contentDigest) zeros(n int) {
	var b [9]byte
	b[0] = 'Z'
	binary.BigEndian.PutUint64(b[1:], uint64(n))
	d.h.Write(b[:])
}

func (d contentDigest) sum() uint64 { return d.h.Sum64() }

var zeros [64 << 10]byte

// isZero reports whether b holds only zero bytes. It compares against a
// zero block with memequal, which stops at the first differing block, so
// ordinary data costs almost nothing.
func isZero(b []byte) bool {
	for len(b) > 0 {
		n := min(len(b), len(zeros))
		if !bytes.Equal(b[:n], zeros[:n]) {
			return false
		}
		b = b[n:]
	}
	return true
}
