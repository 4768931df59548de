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

	"github.com/edgehop/edgehop/internal/criuimg"
)

// Pagemap entry flags (criu/include/pagemap.h).
const (
	peParent  = criuimg.PageInParent
	peLazy    = criuimg.PageLazy
	pePresent = criuimg.PagePresent
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

// readPagemap decodes a CRIU pagemap image (criuimg.DecodePagemap).
// Only entries whose pages are in the pages image (PE_PRESENT) are kept;
// pid is the owner of the addresses.
func readPagemap(path string, pid uint32) (pagemap, error) {
	return readPagemapWhere(path, pid, func(e criuimg.PagemapEntry) bool { return e.Flags&pePresent != 0 })
}

// readPagemapWhere is readPagemap keeping the entries keep accepts.
func readPagemapWhere(path string, pid uint32, keep func(e criuimg.PagemapEntry) bool) (pagemap, error) {
	var pm pagemap
	buf, err := os.ReadFile(path)
	if err != nil {
		return pm, err
	}
	img, err := criuimg.DecodePagemap(buf)
	if err != nil {
		return pm, fmt.Errorf("%s: %w", path, err)
	}
	pm.pagesID = img.PagesID
	err = img.Entries(func(i int, e criuimg.PagemapEntry) error {
		addr, nr := e.Vaddr, e.Pages
		if !keep(e) || nr == 0 {
			return nil
		}
		if addr%PageSize != 0 {
			return fmt.Errorf("entry %d: unaligned address %#x", i, addr)
		}
		if addr >= maxAddr || nr > (maxAddr-addr)/PageSize {
			return fmt.Errorf("entry %d: %d pages at %#x run past the address space", i, nr, addr)
		}
		if k := len(pm.runs); k > 0 && pm.runs[k-1].addr+pm.runs[k-1].count*PageSize == addr {
			pm.runs[k-1].count += nr
		} else {
			pm.runs = append(pm.runs, pageRun{pid: pid, addr: addr, count: nr})
		}
		return nil
	})
	if err != nil {
		return pagemap{}, fmt.Errorf("%s: %w", path, err)
	}
	return pm, nil
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
		pm, err := readPagemapWhere(filepath.Join(dir, e.Name()), uint32(n), func(e criuimg.PagemapEntry) bool {
			return e.HasFlags && e.Flags&peLazy != 0 && e.Flags&pePresent == 0
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
