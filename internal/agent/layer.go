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

	"github.com/edgehop/edgehop/internal/blockdiff"
	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/migration"
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
// since an earlier snapshot, and for comparing trees. The service runs
// meanwhile: an entry it removes during the walk (a database's temporary
// file) is left out, as if listed a moment later.
func listLayer(root string) (layerSnapshot, error) {
	snap := layerSnapshot{entries: map[string]layerEntry{}}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p != root && errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if p == root {
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
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
	// Patched lists the changed files that go as the blocks that changed
	// since their live copy (diffLayer): the delta stream carries each as
	// an empty file with its metadata, and one stream after it the
	// patches' data, in this order.
	Patched []blockdiff.Patch `json:"patched,omitempty"`
}

// buildLayerDelta makes a hidden sibling of root holding the changed
// entries: directories recreated with their mode, owner and extended
// attributes (overlayfs' opaque markers), everything else hard-linked, so
// a SendDir of it in overlay mode carries exactly the changes. The caller
// removes the returned directory.
// A patched file (diffLayer) is an empty file with its metadata.
func buildLayerDelta(root string, changed []string, patched map[string]bool) (string, error) {
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
		if patched[rel] {
			f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err == nil {
				err = f.Close()
			}
			if err == nil {
				err = copyMeta(src, dst, fi)
			}
			if err != nil {
				return dir, fmt.Errorf("layer delta: %w", err)
			}
			continue
		}
		if err := os.Link(src, dst); err != nil {
			return dir, fmt.Errorf("layer delta: %w", err)
		}
	}
	return dir, nil
}

// patchWorth is how much of a file may have changed for it to go as a
// patch: beyond, it goes whole.
const patchWorth = 0.5

// diffLayer finds, among the changed entries of root, the files sums
// holds a record of (as sent in the live copy), single-linked, that
// changed in less than patchWorth of their bytes, and returns their
// patches with the files open for the patches' data (the caller closes
// them). The layer must not change until their data is sent: the service
// is frozen.
func diffLayer(root string, changed []string, sums *blockdiff.Index) ([]blockdiff.Patch, []*os.File, error) {
	if sums == nil {
		return nil, nil, nil
	}
	var patches []blockdiff.Patch
	var files []*os.File
	for _, rel := range changed {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(root, rel), &st); err != nil {
			return patches, files, err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Nlink != 1 || st.Size < blockdiff.MinSize {
			continue
		}
		f, err := linux.OpenInRoot(root, rel, unix.O_RDONLY|unix.O_NOFOLLOW)
		if err != nil {
			return patches, files, err
		}
		p, ok, err := sums.Diff(filepath.ToSlash(rel), f)
		if err != nil || !ok || float64(p.DataLen()) > patchWorth*float64(p.Size) {
			f.Close()
			if err != nil {
				return patches, files, err
			}
			continue
		}
		p.Path = rel
		patches, files = append(patches, p), append(files, f)
	}
	return patches, files, nil
}

// teeSums is the transfer.SendOptions.Tee that records the layer's
// single-linked large files in sums as sent.
func teeSums(sums *blockdiff.Index) func(string, fs.FileInfo) io.Writer {
	return func(rel string, fi fs.FileInfo) io.Writer {
		if st, ok := fi.Sys().(*syscall.Stat_t); !ok || st.Nlink != 1 {
			return nil
		}
		return sums.Writer(rel, fi.Size())
	}
}

// patchData reads the patches' data from their files, in order.
func patchData(patches []blockdiff.Patch, files []*os.File) io.Reader {
	var rs []io.Reader
	for i, p := range patches {
		for _, r := range p.Ranges {
			rs = append(rs, io.NewSectionReader(files[i], r.Off, r.Len))
		}
	}
	return io.MultiReader(rs...)
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
	// lp are the patched files: their entries in delta are stand-ins.
	lp layerPatches
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
		if _, ok := m.lp.at[rel]; ok {
			return rel + ": patched", nil
		}
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
		if i, ok := m.lp.at[rel]; ok && fi.Mode().IsRegular() {
			if err := m.patchInPlace(i); err != nil {
				return false, err
			}
		} else if fi.Mode().IsRegular() {
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

// patchInPlace applies patch i to root's copy of its file.
func (m layerMatch) patchInPlace(i int) error {
	rel := m.lp.patches[i].Path
	f, err := linux.OpenInRoot(m.root, rel, unix.O_WRONLY|unix.O_NOFOLLOW)
	if err != nil {
		return err
	}
	if err := m.lp.apply(i, f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
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
func sendLayerDelta(ctx context.Context, conn *transfer.Conn, root string, before layerSnapshot, sums *blockdiff.Index, opts transfer.SendOptions) (deltaSent, error) {
	now, err := listLayer(root)
	if err != nil {
		return deltaSent{}, err
	}
	changed := now.changedSince(before)
	patches, files, err := diffLayer(root, changed, sums)
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	if err != nil {
		return deltaSent{}, fmt.Errorf("layer delta: %w", err)
	}
	patched := map[string]bool{}
	for _, p := range patches {
		patched[p.Path] = true
	}
	dir, err := buildLayerDelta(root, changed, patched)
	if dir != "" {
		defer os.RemoveAll(dir)
	}
	if err != nil {
		return deltaSent{}, err
	}
	if err := conn.WriteMsg(ctx, msgLayerDelta, LayerDelta{Keep: now.paths(), Changed: len(changed), Patched: patches}); err != nil {
		return deltaSent{}, err
	}
	opts.Name, opts.Overlay, opts.Tee = "upper-delta", true, nil
	ds := deltaSent{changed: len(changed), patched: len(patches)}
	ds.st, err = conn.SendDir(ctx, dir, opts)
	if err != nil || len(patches) == 0 {
		return ds, err
	}
	opts.Name, opts.Overlay = "upper-blocks", false
	bst, err := conn.SendStream(ctx, patchData(patches, files), opts)
	ds.st.WireBytes += bst.WireBytes
	ds.st.PayloadBytes += bst.PayloadBytes
	ds.patchBytes = bst.PayloadBytes
	return ds, err
}

// deltaSent is what sendLayerDelta sent.
type deltaSent struct {
	st         transfer.Stats
	changed    int   // entries sent again
	patched    int   // of them, files sent as patches
	patchBytes int64 // the patches' data
}

// report adds what the delta sent to a migration's result.
func (ds deltaSent) report(res *migration.Result) {
	res.LayerPatched += ds.patched
	res.LayerPatchBytes += ds.patchBytes
}

// recvLayerDelta is the destination's half: root holds the live copy.
func recvLayerDelta(ctx context.Context, conn *transfer.Conn, root string, limit int64) error {
	rd, err := recvDelta(ctx, conn, root, limit)
	defer rd.remove()
	if err != nil {
		return err
	}
	return rd.apply(root)
}

// receivedDelta is a layer delta received beside the live copy it
// applies to: the message, the tree of changed entries (buildLayerDelta's)
// and the patched files with their data.
type receivedDelta struct {
	LayerDelta
	dir string
	lp  layerPatches
}

// recvDelta receives the layer delta for the live copy at root into
// root-delta, within limit bytes. The caller removes what it received
// (remove), whether or not it failed.
func recvDelta(ctx context.Context, conn *transfer.Conn, root string, limit int64) (receivedDelta, error) {
	rd := receivedDelta{dir: root + "-delta"}
	_ = os.RemoveAll(rd.dir)
	if err := expect(ctx, conn, msgLayerDelta, &rd.LayerDelta); err != nil {
		return rd, err
	}
	if _, err := conn.RecvDir(ctx, rd.dir, transfer.RecvOptions{MaxBytes: limit}); err != nil {
		return rd, err
	}
	var err error
	rd.lp, err = recvPatches(ctx, conn, rd.dir, rd.Patched, limit)
	return rd, err
}

// remove removes what recvDelta received.
func (rd receivedDelta) remove() {
	_ = os.RemoveAll(rd.dir)
	rd.lp.remove()
}

// match compares the delta with root, the live copy (matchLayer).
func (rd receivedDelta) match(root string) (layerMatch, error) {
	m, err := matchLayer(root, rd.dir, rd.Keep)
	m.lp = rd.lp
	return m, err
}

// apply makes root, the live copy not in use, equal to the source's
// layer: the patched files built whole, then applyLayerDelta.
func (rd receivedDelta) apply(root string) error {
	if err := rd.lp.materialize(root, rd.dir); err != nil {
		return err
	}
	return applyLayerDelta(root, rd.dir, rd.Keep)
}

// layerPatches are the patched files of a received layer delta
// (LayerDelta.Patched) with their data.
type layerPatches struct {
	patches []blockdiff.Patch
	at      map[string]int // path → index in patches
	offs    []int64        // each patch's data offset in data
	data    string         // the file of their data
}

// recvPatches checks the delta's patches against it (tmp, received) and
// receives their data. Each patched file must be an empty regular file
// in the delta (its stand-in, carrying its metadata).
func recvPatches(ctx context.Context, conn *transfer.Conn, tmp string, patches []blockdiff.Patch, limit int64) (layerPatches, error) {
	lp := layerPatches{patches: patches, at: map[string]int{}}
	if len(patches) == 0 {
		return lp, nil
	}
	var total int64
	for i, p := range patches {
		if err := p.Check(limit); err != nil {
			return lp, err
		}
		if _, dup := lp.at[p.Path]; dup {
			return lp, fmt.Errorf("%s patched twice", p.Path)
		}
		lp.at[p.Path] = i
		f, err := linux.OpenInRoot(tmp, p.Path, unix.O_RDONLY|unix.O_NOFOLLOW)
		if err != nil {
			return lp, fmt.Errorf("patched %s not in the delta: %w", p.Path, err)
		}
		fi, err := f.Stat()
		f.Close()
		if err != nil {
			return lp, err
		}
		if !fi.Mode().IsRegular() || fi.Size() != 0 {
			return lp, fmt.Errorf("patched %s is not an empty file in the delta", p.Path)
		}
		lp.offs = append(lp.offs, total)
		if total += p.DataLen(); total > limit {
			return lp, fmt.Errorf("patches' data over %d bytes", limit)
		}
	}
	lp.data = tmp + "-blocks"
	st, err := conn.RecvFile(ctx, lp.data, transfer.RecvOptions{MaxBytes: total})
	if err != nil {
		return lp, fmt.Errorf("patches' data: %w", err)
	}
	if st.PayloadBytes != total {
		return lp, fmt.Errorf("patches' data is %d bytes, want %d", st.PayloadBytes, total)
	}
	return lp, nil
}

// remove removes the patches' data.
func (lp layerPatches) remove() {
	if lp.data != "" {
		_ = os.Remove(lp.data)
	}
}

// apply applies patch i to dst, opened for writing.
func (lp layerPatches) apply(i int, dst *os.File) error {
	fi, err := dst.Stat()
	if err != nil {
		return err
	}
	p := lp.patches[i]
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("patch %s: this side's copy is not a regular file", p.Path)
	}
	data, err := os.Open(lp.data)
	if err != nil {
		return err
	}
	defer data.Close()
	return blockdiff.Apply(dst, p, io.NewSectionReader(data, lp.offs[i], p.DataLen()))
}

// materialize makes each patched file's stand-in in delta the whole
// file: root's copy with the patch applied, its metadata kept.
func (lp layerPatches) materialize(root, delta string) error {
	for i, p := range lp.patches {
		if err := lp.materializeOne(i, root, delta); err != nil {
			return fmt.Errorf("%s: %w", p.Path, err)
		}
	}
	return nil
}

func (lp layerPatches) materializeOne(i int, root, delta string) error {
	rel := lp.patches[i].Path
	src, err := linux.OpenInRoot(root, rel, unix.O_RDONLY|unix.O_NOFOLLOW)
	if err != nil {
		return fmt.Errorf("this side's copy: %w", err)
	}
	defer src.Close()
	if fi, err := src.Stat(); err != nil {
		return err
	} else if !fi.Mode().IsRegular() {
		return errors.New("this side's copy is not a regular file")
	}
	dst, err := linux.OpenInRoot(delta, rel, unix.O_WRONLY|unix.O_NOFOLLOW)
	if err != nil {
		return err
	}
	defer dst.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(dst.Fd()), &st); err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		return err
	}
	if err := lp.apply(i, dst); err != nil {
		return err
	}
	return linux.Lutimes(filepath.Join(delta, rel), time.Unix(0, st.Atim.Nano()), time.Unix(0, st.Mtim.Nano()))
}

// msgLayerDelta (S→D LayerDelta) precedes the layer's delta stream.
const msgLayerDelta = "layer-delta"
