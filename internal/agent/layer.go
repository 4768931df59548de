package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/transfer"
)

// Storage pre-copy: the container's writable layer (its overlay upper
// directory) goes to the destination while the service runs; in the
// frozen window only what changed since goes, with the list of every
// entry the layer then holds so the destination drops what was deleted.
// "Changed" compares inode, size, mode, mtime and ctime between a
// snapshot taken before the live copy and one taken after the freeze: a
// write, truncate, chmod, chown, xattr change, rename or link updates the
// ctime, which user space cannot set back, so nothing written after the
// first snapshot escapes the delta.

// layerEntry is what a snapshot keeps of one entry.
type layerEntry struct {
	ino, size    int64
	mode         uint32
	mtime, ctime int64 // ns
}

// layerSnapshot maps each entry's path relative to the layer's root
// ("." excluded) to its state, and says when the walk began.
type layerSnapshot struct {
	// at is when the walk began (ns), as the layer's file system stamps
	// times when it can be read so (clockMark), else by the wall clock;
	// slack is how close to at an entry's ctime counts as a change.
	at, slack int64
	entries   map[string]layerEntry
}

// ctimeSlack: file systems stamp times from a coarse clock (a jiffy,
// truncated to their granularity, up to a second), so a write just after
// a snapshot may leave the times it saw unchanged. An entry whose ctime
// was this close to the wall clock's time of the snapshot counts as
// changed.
const ctimeSlack = int64(time.Second)

// markSlack is the slack against a snapshot's time read from its file
// system (clockMark): the same clock stamps both, so only a step of the
// wall clock between them is covered.
const markSlack = int64(50 * time.Millisecond)

// clockMark writes a file next to root (on its file system) and returns
// the ctime the file system gave it: a change to root's entries after
// this gets a ctime at least as late, whatever the clock's granularity.
func clockMark(root string) (int64, error) {
	p := filepath.Join(filepath.Dir(root), "."+filepath.Base(root)+"-clock")
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		return 0, err
	}
	if err := os.Chmod(p, 0o600); err != nil { // a change of the inode: ctime now
		return 0, err
	}
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return 0, err
	}
	return st.Ctim.Nano(), nil
}

// snapshotLayer lists root's entries and marks when the walk began, for a
// later snapshot's changedSince.
func snapshotLayer(root string) (layerSnapshot, error) {
	at, slack := time.Now().UnixNano(), ctimeSlack
	if t, err := clockMark(root); err == nil {
		at, slack = t, markSlack
	}
	snap, err := listLayer(root)
	snap.at, snap.slack = at, slack
	return snap, err
}

// listLayer lists root's entries, with no time: enough for what changed
// since an earlier snapshot, and for comparing trees.
func listLayer(root string) (layerSnapshot, error) {
	snap := layerSnapshot{entries: map[string]layerEntry{}}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		snap.entries[rel] = layerEntry{ino: int64(st.Ino), size: st.Size, mode: st.Mode,
			mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano()}
		return nil
	})
	if err != nil {
		return snap, fmt.Errorf("snapshot layer %s: %w", root, err)
	}
	return snap, nil
}

// changedSince lists, parents before children, the entries of s that are
// new, differ from before, or were changed too close to before's walk to
// be told apart.
func (s layerSnapshot) changedSince(before layerSnapshot) []string {
	var out []string
	for p, e := range s.entries {
		if b, ok := before.entries[p]; !ok || b != e || b.ctime >= before.at-before.slack {
			out = append(out, p)
		}
	}
	slices.Sort(out) // "a" < "a/b": parents first
	return out
}

// paths lists every entry, sorted.
func (s layerSnapshot) paths() []string {
	out := make([]string, 0, len(s.entries))
	for p := range s.entries {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// LayerDelta is the message before the frozen delta of the writable layer.
type LayerDelta struct {
	// Keep lists every entry the layer holds now; the destination removes
	// the others.
	Keep []string `json:"keep"`
	// Changed counts the entries the delta stream carries.
	Changed int `json:"changed"`
}

// buildLayerDelta makes a hidden sibling of root holding the changed
// entries: directories recreated with their mode, owner and extended
// attributes (overlayfs' opaque markers), everything else hard-linked, so
// a SendDir of it in overlay mode carries exactly the changes. The caller
// removes the returned directory.
func buildLayerDelta(root string, changed []string) (string, error) {
	dir, err := os.MkdirTemp(filepath.Dir(root), "."+filepath.Base(root)+"-delta-")
	if err != nil {
		return "", err
	}
	for _, rel := range changed {
		src, dst := filepath.Join(root, rel), filepath.Join(dir, rel)
		if err := ensureParents(root, dir, rel); err != nil {
			return dir, err
		}
		fi, err := os.Lstat(src)
		if err != nil {
			return dir, err
		}
		if fi.IsDir() {
			if err := os.Mkdir(dst, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
				return dir, err
			}
			if err := copyDirMeta(src, dst); err != nil {
				return dir, err
			}
			continue
		}
		if err := os.Link(src, dst); err != nil {
			return dir, fmt.Errorf("layer delta: %w", err)
		}
	}
	return dir, nil
}

// ensureParents creates rel's missing parent directories under dir as
// copies of root's.
func ensureParents(root, dir, rel string) error {
	parent := filepath.Dir(rel)
	if parent == "." {
		return nil
	}
	if _, err := os.Lstat(filepath.Join(dir, parent)); err == nil {
		return nil
	}
	if err := ensureParents(root, dir, parent); err != nil {
		return err
	}
	if err := os.Mkdir(filepath.Join(dir, parent), 0o700); err != nil {
		return err
	}
	return copyDirMeta(filepath.Join(root, parent), filepath.Join(dir, parent))
}

// copyDirMeta gives directory dst src's mode, owner and extended
// attributes.
func copyDirMeta(src, dst string) error {
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return err
	}
	if err := os.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	if err := os.Chmod(dst, fs.FileMode(st.Mode&0o7777)|modeBits(st.Mode)); err != nil {
		return err
	}
	return copyXattrs(src, dst)
}

// modeBits maps setuid/setgid/sticky from a raw mode to fs.FileMode.
func modeBits(m uint32) fs.FileMode {
	var out fs.FileMode
	if m&unix.S_ISUID != 0 {
		out |= fs.ModeSetuid
	}
	if m&unix.S_ISGID != 0 {
		out |= fs.ModeSetgid
	}
	if m&unix.S_ISVTX != 0 {
		out |= fs.ModeSticky
	}
	return out
}

// copyXattrs replaces dst's extended attributes with src's.
func copyXattrs(src, dst string) error {
	names := func(p string) ([]string, error) {
		buf := make([]byte, 4096)
		for {
			n, err := unix.Llistxattr(p, buf)
			if errors.Is(err, unix.ERANGE) {
				buf = make([]byte, len(buf)*4)
				continue
			}
			if errors.Is(err, unix.ENOTSUP) {
				return nil, nil
			}
			if err != nil {
				return nil, err
			}
			var out []string
			for _, s := range strings.Split(string(buf[:n]), "\x00") {
				if s != "" {
					out = append(out, s)
				}
			}
			return out, nil
		}
	}
	have, err := names(dst)
	if err != nil {
		return err
	}
	want, err := names(src)
	if err != nil {
		return err
	}
	for _, n := range have {
		if !slices.Contains(want, n) {
			if err := unix.Lremovexattr(dst, n); err != nil {
				return fmt.Errorf("xattr %s of %s: %w", n, dst, err)
			}
		}
	}
	buf := make([]byte, 64<<10)
	for _, n := range want {
		sz, err := unix.Lgetxattr(src, n, buf)
		if err != nil {
			return fmt.Errorf("xattr %s of %s: %w", n, src, err)
		}
		if err := unix.Lsetxattr(dst, n, buf[:sz], 0); err != nil {
			return fmt.Errorf("xattr %s of %s: %w", n, dst, err)
		}
	}
	return nil
}

// allXattrs keeps every extended attribute (linux.Lxattrs).
func allXattrs(string) bool { return true }

// maxUnchangedCompare: a regular file of the delta larger than this
// counts as changed without being read (layerMatch.unchanged).
const maxUnchangedCompare = 1 << 20

// layerMatch compares the destination's live copy of the writable layer
// (root) with what the source sent in the frozen window: the delta's
// entries (received from buildLayerDelta's directory) and the list of
// every entry its layer holds (LayerDelta.Keep).
type layerMatch struct {
	root, delta string
	// have and want count root's entries and the source's; sameSet says
	// root holds exactly the source's entries.
	have, want int
	sameSet    bool
	rels       []string // the delta's entries, sorted
}

// matchLayer walks root and delta once for unchanged and applyInPlace.
func matchLayer(root, delta string, keep []string) (layerMatch, error) {
	m := layerMatch{root: root, delta: delta}
	cur, err := listLayer(root)
	if err != nil {
		return m, err
	}
	have := cur.paths()
	want := make([]string, 0, len(keep))
	for _, p := range keep {
		want = append(want, filepath.Clean(p))
	}
	slices.Sort(want)
	m.have, m.want, m.sameSet = len(have), len(want), slices.Equal(have, want)
	if !m.sameSet {
		return m, nil
	}
	changed, err := listLayer(delta)
	if err != nil {
		return m, err
	}
	m.rels = changed.paths()
	return m, nil
}

// unchanged says what applying the delta to root (applyLayerDelta) would
// change in it, "" for nothing: root holds exactly the source's entries,
// and every entry of the delta is in root already with the same type,
// mode, owner, mtime, extended attributes and content (a regular file's
// bytes, a link's target, a device's number). The source sends an entry
// whose ctime is close to its snapshot's (layerSnapshot.slack) whether
// or not it changed; most are the same.
func (m layerMatch) unchanged() (string, error) {
	if !m.sameSet {
		return fmt.Sprintf("entries added or removed (%d, was %d)", m.want, m.have), nil
	}
	for _, rel := range m.rels {
		if why, err := sameEntry(filepath.Join(m.delta, rel), filepath.Join(m.root, rel)); err != nil || why != "" {
			return rel + ": " + why, err
		}
	}
	return "", nil
}

// sameEntry says how the entry at b differs from the one at a ("" when
// it does not).
func sameEntry(a, b string) (string, error) {
	var sa, sb unix.Stat_t
	if err := unix.Lstat(a, &sa); err != nil {
		return "", err
	}
	if err := unix.Lstat(b, &sb); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return "new", nil
		}
		return "", err
	}
	switch {
	case sa.Mode != sb.Mode:
		return "type or mode", nil
	case sa.Uid != sb.Uid || sa.Gid != sb.Gid:
		return "owner", nil
	case sa.Mode&unix.S_IFMT != unix.S_IFDIR && sa.Mtim != sb.Mtim:
		return "mtime", nil
	case sa.Mode&unix.S_IFMT == unix.S_IFREG && sa.Size != sb.Size:
		return "size", nil
	case (sa.Mode&unix.S_IFMT == unix.S_IFCHR || sa.Mode&unix.S_IFMT == unix.S_IFBLK) && sa.Rdev != sb.Rdev:
		return "device", nil
	}
	xa, err := linux.Lxattrs(a, allXattrs)
	if err != nil {
		return "", err
	}
	xb, err := linux.Lxattrs(b, allXattrs)
	if err != nil {
		return "", err
	}
	if !maps.EqualFunc(xa, xb, bytes.Equal) {
		return "extended attributes", nil
	}
	switch sa.Mode & unix.S_IFMT {
	case unix.S_IFLNK:
		ta, err := os.Readlink(a)
		if err != nil {
			return "", err
		}
		tb, err := os.Readlink(b)
		if err != nil {
			return "", err
		}
		if ta != tb {
			return "link target", nil
		}
	case unix.S_IFREG:
		if sa.Size > maxUnchangedCompare {
			return "large file", nil
		}
		ba, err := os.ReadFile(a)
		if err != nil {
			return "", err
		}
		bb, err := os.ReadFile(b)
		if err != nil {
			return "", err
		}
		if !bytes.Equal(ba, bb) {
			return "content", nil
		}
	}
	return "", nil
}

// applyInPlace applies the delta to root, while root is an overlay's
// upper directory in use, when it can do so without adding, removing or
// replacing an entry (the overlay caches which entries exist): root holds
// exactly the source's entries, and every entry of the delta is in root,
// of the same type, neither hard-linked nor an overlay marker changed,
// differing in a regular file's content or in metadata only. It then
// rewrites those files' content in place and sets owner, extended
// attributes, mode and mtime, and returns true; otherwise it touches
// nothing and returns false.
func (m layerMatch) applyInPlace() (bool, error) {
	if !m.sameSet {
		return false, nil
	}
	root, delta, rels := m.root, m.delta, m.rels
	for _, rel := range rels {
		var sa, sb unix.Stat_t
		if err := unix.Lstat(filepath.Join(delta, rel), &sa); err != nil {
			return false, err
		}
		if err := unix.Lstat(filepath.Join(root, rel), &sb); err != nil {
			return false, nil
		}
		typ := sa.Mode & unix.S_IFMT
		if typ != sb.Mode&unix.S_IFMT || (typ != unix.S_IFREG && typ != unix.S_IFDIR) {
			// A link's target or a device's number is only replaced.
			if why, err := sameEntry(filepath.Join(delta, rel), filepath.Join(root, rel)); err != nil || why != "" {
				return false, err
			}
			continue
		}
		if typ == unix.S_IFREG && (sa.Nlink > 1 || sb.Nlink > 1) {
			return false, nil
		}
		xa, err := linux.Lxattrs(filepath.Join(delta, rel), allXattrs)
		if err != nil {
			return false, err
		}
		xb, err := linux.Lxattrs(filepath.Join(root, rel), allXattrs)
		if err != nil {
			return false, err
		}
		for _, x := range []map[string][]byte{xa, xb} {
			for n := range x {
				if strings.HasPrefix(n, "trusted.overlay.") && !bytes.Equal(xa[n], xb[n]) {
					return false, nil
				}
			}
		}
	}
	for _, rel := range rels {
		src, dst := filepath.Join(delta, rel), filepath.Join(root, rel)
		fi, err := os.Lstat(src)
		if err != nil {
			return false, err
		}
		if fi.Mode().IsRegular() {
			if why, err := sameEntry(src, dst); err != nil {
				return false, err
			} else if why != "" {
				if err := rewriteFile(src, dst); err != nil {
					return false, err
				}
			}
		}
		if fi.Mode()&fs.ModeSymlink != 0 || fi.IsDir() || fi.Mode().IsRegular() {
			if err := copyMeta(src, dst, fi); err != nil {
				return false, err
			}
		}
	}
	return true, nil
}

// rewriteFile makes the existing file dst hold src's bytes, in place
// (the same inode).
func rewriteFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// copyMeta gives dst src's owner, extended attributes, mode (not a
// link's) and mtime.
func copyMeta(src, dst string, fi fs.FileInfo) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("stat %s: no owner", src)
	}
	if err := os.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	if err := copyXattrs(src, dst); err != nil {
		return err
	}
	if fi.Mode()&fs.ModeSymlink == 0 {
		if err := unix.Chmod(dst, st.Mode&0o7777); err != nil {
			return err
		}
	}
	return linux.Lutimes(dst, time.Unix(0, st.Atim.Nano()), time.Unix(0, st.Mtim.Nano()))
}

// applyLayerDelta makes root equal to the source's layer: entries not in
// keep are removed, then every entry of delta (received from
// buildLayerDelta's directory) replaces root's.
func applyLayerDelta(root, delta string, keep []string) error {
	want := make(map[string]bool, len(keep))
	for _, p := range keep {
		want[filepath.Clean(p)] = true
	}
	cur, err := listLayer(root)
	if err != nil {
		return err
	}
	// Deepest first, so a directory is emptied before it goes.
	gone := slices.DeleteFunc(cur.paths(), func(p string) bool { return want[p] })
	slices.Reverse(gone)
	for _, p := range gone {
		if err := os.RemoveAll(filepath.Join(root, p)); err != nil {
			return err
		}
	}
	changed, err := listLayer(delta)
	if err != nil {
		return err
	}
	for _, rel := range changed.paths() {
		src, dst := filepath.Join(delta, rel), filepath.Join(root, rel)
		fi, err := os.Lstat(src)
		if err != nil {
			return err
		}
		old, oerr := os.Lstat(dst)
		if fi.IsDir() {
			if oerr == nil && !old.IsDir() {
				if err := os.Remove(dst); err != nil {
					return err
				}
				oerr = fs.ErrNotExist
			}
			if oerr != nil {
				if err := os.Mkdir(dst, 0o700); err != nil {
					return err
				}
			}
			if err := copyDirMeta(src, dst); err != nil {
				return err
			}
			continue
		}
		if oerr == nil && old.IsDir() {
			if err := os.RemoveAll(dst); err != nil {
				return err
			}
		}
		if err := os.Rename(src, dst); err != nil {
			return err
		}
	}
	return nil
}

// sendLayerDelta is the source's frozen-window half of storage pre-copy:
// what changed in root since before, and the list of what is left.
func sendLayerDelta(ctx context.Context, conn *transfer.Conn, root string, before layerSnapshot, opts transfer.SendOptions) (transfer.Stats, int, error) {
	now, err := listLayer(root)
	if err != nil {
		return transfer.Stats{}, 0, err
	}
	changed := now.changedSince(before)
	dir, err := buildLayerDelta(root, changed)
	if dir != "" {
		defer os.RemoveAll(dir)
	}
	if err != nil {
		return transfer.Stats{}, 0, err
	}
	if err := conn.WriteMsg(ctx, msgLayerDelta, LayerDelta{Keep: now.paths(), Changed: len(changed)}); err != nil {
		return transfer.Stats{}, 0, err
	}
	opts.Name, opts.Overlay = "upper-delta", true
	st, err := conn.SendDir(ctx, dir, opts)
	return st, len(changed), err
}

// recvLayerDelta is the destination's half: root holds the live copy.
func recvLayerDelta(ctx context.Context, conn *transfer.Conn, root string) error {
	var ld LayerDelta
	if err := expect(ctx, conn, msgLayerDelta, &ld); err != nil {
		return err
	}
	tmp := root + "-delta"
	_ = os.RemoveAll(tmp)
	defer os.RemoveAll(tmp)
	if _, err := conn.RecvDir(ctx, tmp, transfer.RecvOptions{}); err != nil {
		return err
	}
	return applyLayerDelta(root, tmp, ld.Keep)
}

// msgLayerDelta (S→D LayerDelta) precedes the layer's delta stream.
const msgLayerDelta = "layer-delta"
