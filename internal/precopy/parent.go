package precopy

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/edgehop/edgehop/internal/criuimg"
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
	img, err := criuimg.DecodePagemap(buf)
	if err != nil {
		return 0, false, fmt.Errorf("%s: %w", path, err)
	}
	id := img.PagesID
	runs, ok := kept[id]
	if !ok {
		return id, false, nil
	}
	out := append([]byte(nil), img.Magic...)
	out = appendMessage(out, img.Head)
	var pos uint64 // position in the pages image of the entry's first page
	k := 0         // the next kept run
	err = img.Entries(func(i int, e criuimg.PagemapEntry) error {
		vaddr, nr, flags := e.Vaddr, e.Pages, e.Flags
		if flags&pePresent == 0 {
			out = appendMessage(out, e.Msg)
			return nil
		}
		end := pos + nr
		if vaddr%PageSize != 0 || vaddr >= maxAddr || nr > (maxAddr-vaddr)/PageSize {
			return fmt.Errorf("entry %d: %d pages at %#x", i, nr, vaddr)
		}
		for p := pos; p < end; {
			at := vaddr + (p-pos)*PageSize
			if k < len(runs) && runs[k].pos <= p {
				r := runs[k]
				n := min(end, r.pos+r.count) - p
				if r.pid != pid || r.addr+(p-r.pos)*PageSize != at {
					return fmt.Errorf("page %d kept at pid %d %#x, its pagemap has it at pid %d %#x",
						p, r.pid, r.addr+(p-r.pos)*PageSize, pid, at)
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
		return nil
	})
	if err != nil {
		return id, false, fmt.Errorf("%s: %w", path, err)
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

// pagemapHeader starts a pagemap image whose pages image is pages-<id>.
func pagemapHeader(id uint64) []byte { return criuimg.AppendPagemapHead(nil, id) }

// appendEntry appends a pagemap entry as CRIU 4 writes one.
func appendEntry(b []byte, vaddr, nr, flags uint64) []byte {
	return criuimg.AppendPagemapEntry(b, vaddr, nr, flags)
}

// appendMessage appends a 32-bit-size-prefixed message.
func appendMessage(b, m []byte) []byte { return criuimg.AppendPagemapMessage(b, m) }
