package runc

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/stats"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// DumpStats is CRIU's stats-dump image: how long a dump took and how many
// pages it handled. CRIU records times in microseconds.
type DumpStats struct {
	FreezingTime time.Duration // freezing the process tree
	FrozenTime   time.Duration // tree frozen: the service's downtime on the source
	MemdumpTime  time.Duration // collecting memory pages into pipes
	MemwriteTime time.Duration // writing pages to images or the page server
	IrmapResolve time.Duration

	PagesScanned         uint64
	PagesSkippedParent   uint64 // unchanged since a parent (pre-)dump
	PagesWritten         uint64
	PagesLazy            uint64 // left for a lazy (post-copy) restore
	PagePipes            uint64
	PagePipeBufs         uint64
	ShpagesScanned       uint64
	ShpagesSkippedParent uint64
	ShpagesWritten       uint64
}

// RestoreStats is CRIU's stats-restore image.
type RestoreStats struct {
	ForkingTime time.Duration // recreating the process tree
	RestoreTime time.Duration // whole restore

	PagesCompared   uint64
	PagesSkippedCow uint64
	PagesRestored   uint64
}

func usec(v uint32) time.Duration { return time.Duration(v) * time.Microsecond }

// ReadDumpStats reads stats-dump, which CRIU writes into the checkpoint's
// work directory (CheckpointOpts.WorkPath, or ImagePath when that is
// empty), not necessarily next to the images.
func ReadDumpStats(workDir string) (DumpStats, error) {
	e, err := readStats(filepath.Join(workDir, stats.StatsDump))
	if err != nil {
		return DumpStats{}, err
	}
	d := e.GetDump()
	if d == nil {
		return DumpStats{}, fmt.Errorf("read %s: no dump entry", filepath.Join(workDir, stats.StatsDump))
	}
	return DumpStats{
		FreezingTime:         usec(d.GetFreezingTime()),
		FrozenTime:           usec(d.GetFrozenTime()),
		MemdumpTime:          usec(d.GetMemdumpTime()),
		MemwriteTime:         usec(d.GetMemwriteTime()),
		IrmapResolve:         usec(d.GetIrmapResolve()),
		PagesScanned:         d.GetPagesScanned(),
		PagesSkippedParent:   d.GetPagesSkippedParent(),
		PagesWritten:         d.GetPagesWritten(),
		PagesLazy:            d.GetPagesLazy(),
		PagePipes:            d.GetPagePipes(),
		PagePipeBufs:         d.GetPagePipeBufs(),
		ShpagesScanned:       d.GetShpagesScanned(),
		ShpagesSkippedParent: d.GetShpagesSkippedParent(),
		ShpagesWritten:       d.GetShpagesWritten(),
	}, nil
}

// ReadRestoreStats reads stats-restore, which CRIU writes into the
// restore's work directory (RestoreOpts.WorkPath, or ImagePath when that
// is empty).
func ReadRestoreStats(workDir string) (RestoreStats, error) {
	e, err := readStats(filepath.Join(workDir, stats.StatsRestore))
	if err != nil {
		return RestoreStats{}, err
	}
	r := e.GetRestore()
	if r == nil {
		return RestoreStats{}, fmt.Errorf("read %s: no restore entry", filepath.Join(workDir, stats.StatsRestore))
	}
	return RestoreStats{
		ForkingTime:     usec(r.GetForkingTime()),
		RestoreTime:     usec(r.GetRestoreTime()),
		PagesCompared:   r.GetPagesCompared(),
		PagesSkippedCow: r.GetPagesSkippedCow(),
		PagesRestored:   r.GetPagesRestored(),
	}, nil
}

// readStats decodes a CRIU stats image: two magics, a 32-bit payload
// size, and one StatsEntry protobuf (go-criu's stats package layout, with
// the bounds checks its reader lacks).
func readStats(path string) (*stats.StatsEntry, error) {
	buf, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read criu stats: %w", err)
	}
	if len(buf) < stats.PayloadOffset {
		return nil, fmt.Errorf("read %s: %d bytes is too short for a criu image", path, len(buf))
	}
	if m := binary.LittleEndian.Uint32(buf[stats.PrimaryMagicOffset:]); m != stats.ImgServiceMagic {
		return nil, fmt.Errorf("read %s: primary magic %#x is not criu's %#x", path, m, stats.ImgServiceMagic)
	}
	if m := binary.LittleEndian.Uint32(buf[stats.SecondaryMagicOffset:]); m != stats.StatsMagic {
		return nil, fmt.Errorf("read %s: secondary magic %#x is not stats %#x", path, m, stats.StatsMagic)
	}
	size := binary.LittleEndian.Uint32(buf[stats.SizeOffset:])
	if uint64(size) > uint64(len(buf)-stats.PayloadOffset) {
		return nil, fmt.Errorf("read %s: payload of %d bytes overruns the %d-byte file", path, size, len(buf))
	}
	e := &stats.StatsEntry{}
	if err := proto.Unmarshal(buf[stats.PayloadOffset:stats.PayloadOffset+int(size)], e); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return e, nil
}

// Pagemap entry flags (criu/include/pagemap.h).
const (
	pageInParent = 1 << 0 // PE_PARENT: the pages are in a parent image
	pageLazy     = 1 << 1 // PE_LAZY: may be restored lazily (set in every dump)
	pagePresent  = 1 << 2 // PE_PRESENT: the pages are in this dump's pages image
)

// MemoryStats summarizes a checkpoint's memory from its pagemap images. It
// is exact where CRIU's own stats-dump is not: for a lazy dump CRIU 4.2.1
// writes stats-dump with zero page counters and a meaningless frozen time.
type MemoryStats struct {
	Processes int    // pagemap images, one per dumped process
	Pages     uint64 // pages of private memory the images describe
	// PresentPages are stored in the images (pages-*.img, or sent to a
	// remote page server).
	PresentPages uint64
	// LazyPages were left out of the images by a lazy dump: the restored
	// processes fault them in from the source's page server.
	LazyPages   uint64
	ParentPages uint64 // stored in a parent (pre-dump) image
	// ImageBytes is the size of every file in the image directory: what
	// must be shipped to the restoring node (lazy pages excluded).
	ImageBytes int64
}

// ReadMemoryStats reads every pagemap-*.img in a checkpoint's image
// directory.
func ReadMemoryStats(imageDir string) (MemoryStats, error) {
	var ms MemoryStats
	ents, err := os.ReadDir(imageDir)
	if err != nil {
		return ms, fmt.Errorf("read memory stats: %w", err)
	}
	for _, e := range ents {
		info, err := e.Info()
		if err != nil {
			return ms, fmt.Errorf("read memory stats: %w", err)
		}
		if info.Mode().IsRegular() {
			ms.ImageBytes += info.Size()
		}
		name := e.Name()
		if !strings.HasPrefix(name, "pagemap-") || !strings.HasSuffix(name, ".img") {
			continue
		}
		ms.Processes++
		if err := addPagemap(&ms, filepath.Join(imageDir, name)); err != nil {
			return ms, err
		}
	}
	if ms.Processes == 0 {
		return ms, fmt.Errorf("read memory stats: no pagemap images in %s", imageDir)
	}
	return ms, nil
}

// CRIU image magics (criu/include/magic.h).
const (
	imgCommonMagic = 0x54564319 // precedes the magic of most images
	pagemapMagic   = 0x56084025
)

// addPagemap adds one pagemap image to ms. The image is the common magic,
// the pagemap magic, then 32-bit-size-prefixed protobufs: a PagemapHead
// and one PagemapEntry per run of pages. Entries are decoded field by
// field because CRIU 4 moved the page count to field 5 (nr_pages,
// uint64), keeping field 2 (compat_nr_pages) for old images, and
// go-criu's generated type knows only field 2.
func addPagemap(ms *MemoryStats, path string) error {
	buf, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read memory stats: %w", err)
	}
	if len(buf) < 8 || binary.LittleEndian.Uint32(buf) != imgCommonMagic ||
		binary.LittleEndian.Uint32(buf[4:]) != pagemapMagic {
		return fmt.Errorf("read memory stats: %s is not a criu pagemap image", path)
	}
	buf = buf[8:]
	for i := 0; len(buf) > 0; i++ {
		if len(buf) < 4 {
			return fmt.Errorf("read memory stats: %s: truncated entry size", path)
		}
		size := binary.LittleEndian.Uint32(buf)
		buf = buf[4:]
		if uint64(size) > uint64(len(buf)) {
			return fmt.Errorf("read memory stats: %s: entry of %d bytes overruns the image", path, size)
		}
		payload := buf[:size]
		buf = buf[size:]
		if i == 0 {
			continue // the head: which pages image holds the data
		}
		pe, err := decodePagemapEntry(payload)
		if err != nil {
			return fmt.Errorf("read memory stats: %s: entry %d: %w", path, i, err)
		}
		ms.Pages += pe.pages
		switch {
		case pe.flags&pagePresent != 0:
			ms.PresentPages += pe.pages
		case pe.flags&pageLazy != 0:
			ms.LazyPages += pe.pages
		}
		if pe.inParent || pe.flags&pageInParent != 0 {
			ms.ParentPages += pe.pages
		}
	}
	return nil
}

type pagemapEntry struct {
	pages    uint64
	flags    uint64
	inParent bool
}

// decodePagemapEntry decodes criu's pagemap_entry (images/pagemap.proto):
// vaddr = 1, compat_nr_pages = 2, in_parent = 3, flags = 4, nr_pages = 5.
func decodePagemapEntry(b []byte) (pagemapEntry, error) {
	var pe pagemapEntry
	var compat uint64
	haveNr := false
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return pe, protowire.ParseError(n)
		}
		b = b[n:]
		if typ != protowire.VarintType {
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return pe, protowire.ParseError(n)
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return pe, protowire.ParseError(n)
		}
		b = b[n:]
		switch num {
		case 2:
			compat = v
		case 3:
			pe.inParent = v != 0
		case 4:
			pe.flags = v
		case 5:
			pe.pages, haveNr = v, true
		}
	}
	if !haveNr {
		pe.pages = compat
	}
	return pe, nil
}
