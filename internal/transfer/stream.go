package transfer

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io/fs"
	"os"
	"strings"

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

// Entry types in entry.Type. Streams sent with SendOptions.Overlay may also
// carry the special files and hard links after entrySymlink.
const (
	entryDir      = "dir"
	entryFile     = "file"
	entrySymlink  = "symlink"
	entryCharDev  = "chardev" // an overlayfs whiteout is chardev 0:0
	entryBlockDev = "blockdev"
	entryFIFO     = "fifo"
	entrySocket   = "socket"
	entryHardlink = "hardlink" // Target names an earlier non-directory entry
)

// specialTypes maps the special-file entry types to their file type bits.
var specialTypes = map[string]fs.FileMode{
	entryCharDev:  fs.ModeDevice | fs.ModeCharDevice,
	entryBlockDev: fs.ModeDevice,
	entryFIFO:     fs.ModeNamedPipe,
	entrySocket:   fs.ModeSocket,
}

// entry describes one directory-tree member. Data frames that follow a
// file entry are that file's content, up to the next entry or the end.
type entry struct {
	// Path is slash-separated and relative to the tree's root; "." is the
	// root itself, always the first entry. Parents come before children.
	Path string `json:"path"`
	Type string `json:"type"`
	// Mode holds permission, setuid, setgid and sticky bits (os.FileMode).
	Mode uint32 `json:"mode"`
	// Target is a symlink's target, or for a hard link the path of the
	// entry it links to.
	Target string `json:"target,omitempty"`
	// UID and GID own the entry; a receiver running as root applies them.
	UID int `json:"uid"`
	GID int `json:"gid"`
	// MTime is the modification time in Unix nanoseconds.
	MTime int64 `json:"mtime"`
	// Major and Minor number a device node.
	Major uint32 `json:"major,omitempty"`
	Minor uint32 `json:"minor,omitempty"`
	// Xattrs holds the extended attributes keepXattr selects (Overlay
	// streams only).
	Xattrs map[string][]byte `json:"xattrs,omitempty"`
}

// keepXattr selects the extended attributes an Overlay stream carries:
// overlayfs' own (trusted.overlay.*, or user.overlay.* when mounted with
// userxattr), every other trusted.* and user.* attribute, file
// capabilities and POSIX ACLs. Others (security.selinux and the like)
// describe the sending host's policy, not the layer.
func keepXattr(name string) bool {
	switch name {
	case "security.capability", "system.posix_acl_access", "system.posix_acl_default":
		return true
	}
	return strings.HasPrefix(name, "trusted.") || strings.HasPrefix(name, "user.")
}

const modeMask = os.ModePerm | os.ModeSetuid | os.ModeSetgid | os.ModeSticky

// summary is the payload of a stream's last frame.
type summary struct {
	Files    int64  `json:"files"`
	Dirs     int64  `json:"dirs"`
	Symlinks int64  `json:"symlinks"`
	Specials int64  `json:"specials,omitempty"`
	Links    int64  `json:"hardlinks,omitempty"`
	Bytes    int64  `json:"bytes"`
	Chunks   int64  `json:"chunks"`
	Digest   string `json:"digest"`
}

func summaryOf(s Stats) summary {
	return summary{
		Files: s.Files, Dirs: s.Dirs, Symlinks: s.Symlinks,
		Specials: s.Specials, Links: s.Hardlinks,
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
