package precopy

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// CRIU image magics (criu/include/magic.h).
const (
	imgCommonMagic = 0x54564319
	pagemapMagic   = 0x56084025
)

// Pagemap entry flags (criu/include/pagemap.h).
const (
	peParent  = 1 << 0
	peLazy    = 1 << 1
	pePresent = 1 << 2
)

var (
	pagesImageRE   = regexp.MustCompile(`^pages-([0-9]+)\.img$`)
	pagemapImageRE = regexp.MustCompile(`^pagemap-(shmem-)?([0-9]+)\.img$`)
)

// isPagesImage reports whether name is a CRIU pages image.
func isPagesImage(name string) bool { return pagesImageRE.MatchString(name) }

// IsMemoryImage reports whether name is one of CRIU's images of a
// process's memory: pages-N.img, pagemap-N.img or pagemap-shmem-N.img.
func IsMemoryImage(name string) bool {
	return pagesImageRE.MatchString(name) || pagemapImageRE.MatchString(name)
}

// pageRun is a run of consecutive pages in a pages image: count pages that
// a process (pid, 0 for shared memory) has at addr onwards.
type pageRun struct {
	pid   uint32
	addr  uint64
	count uint64
}

// pagesImage is one pages-<id>.img of a dump and where its pages live.
type pagesImage struct {
	id    uint64
	path  string
	size  int64
	mode  os.FileMode
	mtime time.Time // when it was described; a changed image was rewritten
	// runs locate the image's pages in order; nil when no pagemap
	// describes the image (its pages are then sent without an address).
	runs []pageRun
}

// pagemap is a decoded pagemap image.
type pagemap struct {
	pagesID uint64
	runs    []pageRun // the pages stored in the pages image, in order
}

// readPagemap decodes a CRIU pagemap image: the common magic, the pagemap
// magic, then 32-bit-size-prefixed protobufs: a pagemap_head (pages_id =
// 1) and one pagemap_entry per run. Entries are decoded field by field
// because CRIU 4 moved the page count to field 5 (nr_pages, uint64),
// keeping field 2 (compat_nr_pages) for old images, and go-criu v7.2.0's
// generated type knows only field 2. Only entries whose pages are in the
// pages image (PE_PRESENT) are kept; pid is the owner of the addresses.
func readPagemap(path string, pid uint32) (pagemap, error) {
	return readPagemapWhere(path, pid, func(flags uint64, hasFlags, inParent bool) bool {
		return flags&pePresent != 0 || (!hasFlags && !inParent)
	})
}

// readPagemapWhere is readPagemap keeping the entries keep accepts.
func readPagemapWhere(path string, pid uint32, keep func(flags uint64, hasFlags, inParent bool) bool) (pagemap, error) {
	var pm pagemap
	buf, err := os.ReadFile(path)
	if err != nil {
		return pm, err
	}
	msgs, err := pagemapMessages(path, buf)
	if err != nil {
		return pm, err
	}
	for i, m := range msgs {
		fields, err := varintFields(m)
		if err != nil {
			return pm, fmt.Errorf("%s: entry %d: %w", path, i, err)
		}
		if i == 0 {
			pm.pagesID = fields[1]
			continue
		}
		addr, nr := fields[1], fields[5]
		if _, ok := fields[5]; !ok {
			nr = fields[2]
		}
		flags, inParent := fields[4], fields[3] != 0
		_, hasFlags := fields[4]
		if !keep(flags, hasFlags, inParent) || nr == 0 {
			continue
		}
		if addr%PageSize != 0 {
			return pm, fmt.Errorf("%s: entry %d: unaligned address %#x", path, i, addr)
		}
		if addr >= maxAddr || nr > (maxAddr-addr)/PageSize {
			return pm, fmt.Errorf("%s: entry %d: %d pages at %#x run past the address space", path, i, nr, addr)
		}
		if k := len(pm.runs); k > 0 && pm.runs[k-1].addr+pm.runs[k-1].count*PageSize == addr {
			pm.runs[k-1].count += nr
		} else {
			pm.runs = append(pm.runs, pageRun{pid: pid, addr: addr, count: nr})
		}
	}
	return pm, nil
}

// varintFields decodes a protobuf message whose fields of interest are
// all varints, by field number; other fields are skipped.
func varintFields(b []byte) (map[protowire.Number]uint64, error) {
	out := map[protowire.Number]uint64{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
		if typ != protowire.VarintType {
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return nil, protowire.ParseError(n)
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
		out[num] = v
	}
	return out, nil
}

// readImages finds the pages images of a dump in dir and, from the
// pagemap images, where each of their pages lives. Pages images that no
// pagemap describes, or whose size disagrees with their pagemap, are
// returned without runs (sent as anonymous data). warn receives the
// reason for each such fallback.
func readImages(dir string, warn func(msg string, args ...any)) ([]pagesImage, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var images []pagesImage
	maps := map[uint64]pagemap{}
	for _, e := range ents {
		name := e.Name()
		if id, ok, err := pagesImageID(name); ok || err != nil {
			if err != nil {
				return nil, err
			}
			im, err := statPagesImage(dir, id)
			if err != nil {
				return nil, err
			}
			images = append(images, im)
			continue
		}
		pid, ok, err := pagemapPID(name)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		pm, err := readPagemap(filepath.Join(dir, name), pid)
		if err != nil {
			return nil, err
		}
		if _, dup := maps[pm.pagesID]; dup {
			return nil, fmt.Errorf("%s: pages image %d described twice", name, pm.pagesID)
		}
		maps[pm.pagesID] = pm
	}
	slices.SortFunc(images, func(a, b pagesImage) int { return cmp.Compare(a.id, b.id) })
	for i := range images {
		pm, ok := maps[images[i].id]
		images[i].locate(pm, ok, warn)
	}
	return images, nil
}

// pagesImageID parses a pages image's name; ok is false for other names.
func pagesImageID(name string) (id uint64, ok bool, err error) {
	m := pagesImageRE.FindStringSubmatch(name)
	if m == nil {
		return 0, false, nil
	}
	id, err = strconv.ParseUint(m[1], 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("%s: %w", name, err)
	}
	return id, true, nil
}

// pagemapPID parses a pagemap image's name: the pid whose addresses it
// describes, 0 for shared memory; ok is false for other names.
func pagemapPID(name string) (pid uint32, ok bool, err error) {
	m := pagemapImageRE.FindStringSubmatch(name)
	if m == nil {
		return 0, false, nil
	}
	if m[1] == "" {
		n, err := strconv.ParseUint(m[2], 10, 32)
		if err != nil || n == 0 {
			return 0, false, fmt.Errorf("%s: bad pid", name)
		}
		pid = uint32(n)
	}
	return pid, true, nil
}

// statPagesImage describes pages-<id>.img in dir, without runs.
func statPagesImage(dir string, id uint64) (pagesImage, error) {
	path := filepath.Join(dir, fmt.Sprintf("pages-%d.img", id))
	info, err := os.Lstat(path)
	if err != nil {
		return pagesImage{}, err
	}
	if !info.Mode().IsRegular() {
		return pagesImage{}, fmt.Errorf("%s is not a regular file", path)
	}
	if info.Size()%PageSize != 0 {
		return pagesImage{}, fmt.Errorf("%s: %d bytes is not a whole number of pages", path, info.Size())
	}
	return pagesImage{id: id, path: path, size: info.Size(), mode: info.Mode().Perm(), mtime: info.ModTime()}, nil
}

// locate gives im the runs of its pagemap pm (ok: there is one) when they
// account for every page of it; otherwise warn says why it stays without.
func (im *pagesImage) locate(pm pagemap, ok bool, warn func(msg string, args ...any)) {
	if !ok {
		warn("pages image without a pagemap: sent as data", "image", im.path)
		return
	}
	var pages uint64
	for _, r := range pm.runs {
		pages += r.count
	}
	if pages*PageSize != uint64(im.size) {
		warn("pagemap disagrees with its pages image: sent as data", "image", im.path, "pagemap_pages", pages, "image_bytes", im.size)
		return
	}
	im.runs = pm.runs
}

// LazyRun is a run of pages a lazy dump left on the source's page server:
// count pages of process pid (in the container's pid namespace) from addr.
type LazyRun struct {
	PID   uint32
	Addr  uint64
	Pages uint64
}

// LazyRuns reads a lazy dump's pagemaps in dir and returns the runs of
// pages CRIU's page server holds (PE_LAZY entries without PE_PRESENT),
// adjacent entries joined.
func LazyRuns(dir string) ([]LazyRun, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []LazyRun
	for _, e := range ents {
		m := pagemapImageRE.FindStringSubmatch(e.Name())
		if m == nil || m[1] != "" {
			continue // not a pagemap, or shared memory's (never lazy)
		}
		n, err := strconv.ParseUint(m[2], 10, 32)
		if err != nil || n == 0 {
			return nil, fmt.Errorf("%s: bad pid", e.Name())
		}
		pm, err := readPagemapWhere(filepath.Join(dir, e.Name()), uint32(n), func(flags uint64, hasFlags, _ bool) bool {
			return hasFlags && flags&peLazy != 0 && flags&pePresent == 0
		})
		if err != nil {
			return nil, err
		}
		for _, r := range pm.runs {
			out = append(out, LazyRun{PID: r.pid, Addr: r.addr, Pages: r.count})
		}
	}
	return out, nil
}
