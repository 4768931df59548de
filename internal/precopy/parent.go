package precopy

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"google.golang.org/protobuf/encoding/protowire"
)

// ParentDir is the name, in a rebuilt image directory, of the parent
// image directory CRIU's restore reads the pages left in the store from
// (CRIU's CR_PARENT_LINK).
const ParentDir = "parent"

// linkParent makes the pages left in the store part of the image
// directory, as an incremental dump's parent: in each pagemap whose
// pages image kept pages, the entries are split so that the kept pages
// are marked PE_PARENT (the others keep their flags, and the pages
// image holds exactly theirs); and imgDir/parent holds, for each such
// process, a hard link to its store file as a pages image and a pagemap
// of one entry spanning the address space, so that the page at address
// a is read at offset a. Every kept run must be where the pagemap puts
// its pages, in the process it names (ErrCorrupt otherwise).
func (b *finalBuilder) linkParent(imgDir string) error {
	if len(b.kept) == 0 {
		return nil
	}
	ents, err := os.ReadDir(imgDir)
	if err != nil {
		return err
	}
	parent := filepath.Join(imgDir, ParentDir)
	if err := os.Mkdir(parent, 0o700); err != nil {
		return fmt.Errorf("%w: parent image directory: %w", ErrCorrupt, err)
	}
	linked := map[uint32]bool{}
	for _, e := range ents {
		pid, ok, err := pagemapPID(e.Name())
		if err != nil {
			return fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
		if !ok || pid == 0 {
			continue // shared memory's pages are never kept
		}
		path := filepath.Join(imgDir, e.Name())
		id, did, err := splitPagemap(path, pid, b.kept)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
		if !did {
			continue
		}
		delete(b.kept, id)
		if linked[pid] {
			return fmt.Errorf("%w: two pagemaps of pid %d", ErrCorrupt, pid)
		}
		linked[pid] = true
		if err := b.linkStoreFile(parent, pid); err != nil {
			return err
		}
	}
	if len(b.kept) > 0 {
		return fmt.Errorf("%w: %d pages images kept pages but have no pagemap", ErrCorrupt, len(b.kept))
	}
	return nil
}

// linkStoreFile makes pid's store file pages-<pid>.img of the parent
// directory, described by pagemap-<pid>.img as one run from address 0.
func (b *finalBuilder) linkStoreFile(parent string, pid uint32) error {
	f, ok := b.s.files[pid]
	if !ok {
		return fmt.Errorf("%w: no pages of pid %d", ErrCorrupt, pid)
	}
	n := strconv.FormatUint(uint64(pid), 10)
	if err := os.Link(f.Name(), filepath.Join(parent, "pages-"+n+".img")); err != nil {
		return fmt.Errorf("parent image: %w", err)
	}
	img := pagemapHeader(uint64(pid))
	img = appendEntry(img, 0, maxAddr/PageSize, pePresent)
	if err := os.WriteFile(filepath.Join(parent, "pagemap-"+n+".img"), img, 0o600); err != nil {
		return fmt.Errorf("parent image: %w", err)
	}
	return nil
}

// splitPagemap rewrites the pagemap image path of process pid if its
// pages image is one of kept's: the kept runs' pages become PE_PARENT
// entries. It returns the pages image's id and whether it rewrote.
func splitPagemap(path string, pid uint32, kept map[uint64][]keptRun) (uint64, bool, error) {
	buf, err := os.ReadFile(path)
	if err != nil {
		return 0, false, err
	}
	msgs, err := pagemapMessages(path, buf)
	if err != nil {
		return 0, false, err
	}
	if len(msgs) == 0 {
		return 0, false, fmt.Errorf("%s: no pagemap head", path)
	}
	head, err := varintFields(msgs[0])
	if err != nil {
		return 0, false, fmt.Errorf("%s: head: %w", path, err)
	}
	id := head[1]
	runs, ok := kept[id]
	if !ok {
		return id, false, nil
	}
	out := append([]byte(nil), buf[:8]...)
	out = appendMessage(out, msgs[0])
	var pos uint64 // position in the pages image of the entry's first page
	k := 0         // the next kept run
	for i, m := range msgs[1:] {
		f, err := varintFields(m)
		if err != nil {
			return id, false, fmt.Errorf("%s: entry %d: %w", path, i, err)
		}
		vaddr, nr, flags := entryFields(f)
		if flags&pePresent == 0 {
			out = appendMessage(out, m)
			continue
		}
		end := pos + nr
		if vaddr%PageSize != 0 || vaddr >= maxAddr || nr > (maxAddr-vaddr)/PageSize {
			return id, false, fmt.Errorf("%s: entry %d: %d pages at %#x", path, i, nr, vaddr)
		}
		for p := pos; p < end; {
			at := vaddr + (p-pos)*PageSize
			if k < len(runs) && runs[k].pos <= p {
				r := runs[k]
				n := min(end, r.pos+r.count) - p
				if r.pid != pid || r.addr+(p-r.pos)*PageSize != at {
					return id, false, fmt.Errorf("%s: page %d kept at pid %d %#x, its pagemap has it at pid %d %#x",
						path, p, r.pid, r.addr+(p-r.pos)*PageSize, pid, at)
				}
				out = appendEntry(out, at, n, flags&^pePresent|peParent)
				if p += n; p == r.pos+r.count {
					k++
				}
				continue
			}
			next := end
			if k < len(runs) && runs[k].pos < end {
				next = runs[k].pos
			}
			out = appendEntry(out, at, next-p, flags)
			p = next
		}
		pos = end
	}
	if k < len(runs) {
		return id, false, fmt.Errorf("%s: kept pages from position %d past its %d pages", path, runs[k].pos, pos)
	}
	tmp := path + ".split"
	if err := os.WriteFile(tmp, out, 0o600); err != nil {
		return id, false, err
	}
	info, err := os.Stat(path)
	if err == nil {
		err = os.Chmod(tmp, info.Mode().Perm()) // not subject to the umask
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return id, false, err
	}
	return id, true, nil
}

// entryFields reads a pagemap entry's address, page count and flags; an
// older CRIU's entry (no flags) as CRIU's init_compat_pagemap_entry
// does.
func entryFields(f map[protowire.Number]uint64) (vaddr, nr, flags uint64) {
	nr, ok := f[5]
	if !ok {
		nr = f[2]
	}
	flags, ok = f[4]
	if !ok {
		flags = pePresent
		if f[3] != 0 {
			flags = peParent
		}
	}
	return f[1], nr, flags
}

// pagemapMessages splits a pagemap image into its protobuf messages (the
// head, then the entries) after checking its magics.
func pagemapMessages(path string, buf []byte) ([][]byte, error) {
	if len(buf) < 8 || binary.LittleEndian.Uint32(buf) != imgCommonMagic ||
		binary.LittleEndian.Uint32(buf[4:]) != pagemapMagic {
		return nil, fmt.Errorf("%s is not a criu pagemap image", path)
	}
	var msgs [][]byte
	for b := buf[8:]; len(b) > 0; {
		if len(b) < 4 {
			return nil, fmt.Errorf("%s: truncated entry size", path)
		}
		size := binary.LittleEndian.Uint32(b)
		b = b[4:]
		if uint64(size) > uint64(len(b)) {
			return nil, fmt.Errorf("%s: entry of %d bytes overruns the image", path, size)
		}
		msgs = append(msgs, b[:size])
		b = b[size:]
	}
	return msgs, nil
}

// pagemapHeader starts a pagemap image whose pages image is pages-<id>.
func pagemapHeader(id uint64) []byte {
	b := binary.LittleEndian.AppendUint32(nil, imgCommonMagic)
	b = binary.LittleEndian.AppendUint32(b, pagemapMagic)
	return appendMessage(b, protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), id))
}

// appendEntry appends a pagemap entry as CRIU 4 writes one: vaddr, a
// zero compat_nr_pages, flags and nr_pages.
func appendEntry(b []byte, vaddr, nr, flags uint64) []byte {
	var m []byte
	for _, f := range []struct {
		n protowire.Number
		v uint64
	}{{1, vaddr}, {2, 0}, {4, flags}, {5, nr}} {
		m = protowire.AppendVarint(protowire.AppendTag(m, f.n, protowire.VarintType), f.v)
	}
	return appendMessage(b, m)
}

// appendMessage appends a 32-bit-size-prefixed message.
func appendMessage(b, m []byte) []byte {
	return append(binary.LittleEndian.AppendUint32(b, uint32(len(m))), m...)
}
