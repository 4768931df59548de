package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

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
	at      int64 // ns, wall clock
	entries map[string]layerEntry
}

// ctimeSlack: file systems stamp times from a coarse clock (a jiffy), so
// a write just after a snapshot may leave the times it saw unchanged. An
// entry whose ctime was this close to the snapshot counts as changed.
const ctimeSlack = int64(time.Second)

func snapshotLayer(root string) (layerSnapshot, error) {
	snap := layerSnapshot{at: time.Now().UnixNano(), entries: map[string]layerEntry{}}
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
		if b, ok := before.entries[p]; !ok || b != e || b.ctime >= before.at-ctimeSlack {
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

// applyLayerDelta makes root equal to the source's layer: entries not in
// keep are removed, then every entry of delta (received from
// buildLayerDelta's directory) replaces root's.
func applyLayerDelta(root, delta string, keep []string) error {
	want := make(map[string]bool, len(keep))
	for _, p := range keep {
		want[filepath.Clean(p)] = true
	}
	cur, err := snapshotLayer(root)
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
	changed, err := snapshotLayer(delta)
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
	now, err := snapshotLayer(root)
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
