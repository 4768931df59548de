package runc

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/stats"
	"github.com/edgehop/edgehop/internal/criuimg"
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

// addPagemap adds one pagemap image (criuimg.DecodePagemap) to ms.
func addPagemap(ms *MemoryStats, path string) error {
	buf, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read memory stats: %w", err)
	}
	pm, err := criuimg.DecodePagemap(buf)
	if err == nil {
		err = pm.Entries(func(_ int, e criuimg.PagemapEntry) error {
			ms.Pages += e.Pages
			switch {
			case e.Flags&criuimg.PagePresent != 0:
				ms.PresentPages += e.Pages
			case e.Flags&criuimg.PageLazy != 0:
				ms.LazyPages += e.Pages
			}
			if e.InParent || e.Flags&criuimg.PageInParent != 0 {
				ms.ParentPages += e.Pages
			}
			return nil
		})
	}
	if err != nil {
		return fmt.Errorf("read memory stats: %s: %w", path, err)
	}
	return nil
}
