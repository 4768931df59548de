package agent

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/edgehop/edgehop/internal/migration"
	"github.com/edgehop/edgehop/internal/runc"
)

// dumpStatsMap flattens CRIU's dump statistics with the names the model
// package reads (times in microseconds, as CRIU records them).
func dumpStatsMap(s runc.DumpStats) map[string]float64 {
	return map[string]float64{
		"freezing_time_us":     float64(s.FreezingTime.Microseconds()),
		"frozen_time_us":       float64(s.FrozenTime.Microseconds()),
		"memdump_time_us":      float64(s.MemdumpTime.Microseconds()),
		"memwrite_time_us":     float64(s.MemwriteTime.Microseconds()),
		"pages_scanned":        float64(s.PagesScanned),
		"pages_written":        float64(s.PagesWritten),
		"pages_skipped_parent": float64(s.PagesSkippedParent),
		"pages_lazy":           float64(s.PagesLazy),
	}
}

func restoreStatsMap(s runc.RestoreStats) map[string]float64 {
	return map[string]float64{
		"restore_time_us": float64(s.RestoreTime.Microseconds()),
		"forking_time_us": float64(s.ForkingTime.Microseconds()),
		"pages_restored":  float64(s.PagesRestored),
		"pages_compared":  float64(s.PagesCompared),
	}
}

// History file bounds: a result's error text is cut to maxResultError
// bytes, so no line nears what history reads of one (maxHistoryLine); the
// file is rotated to migrations.jsonl.1 past maxHistoryBytes, so the two
// hold the last few thousand migrations.
const (
	maxResultError  = 4 << 10
	maxHistoryLine  = 4 << 20
	maxHistoryBytes = 16 << 20
	historyFile     = "migrations.jsonl"
)

// recordHistory appends a migration result to the node's history file.
func (a *Agent) recordHistory(r migration.Result) {
	if len(r.Error) > maxResultError {
		r.Error = r.Error[:maxResultError] + "…"
	}
	path := filepath.Join(a.cfg.StateDir, historyFile)
	if st, err := os.Stat(path); err == nil && st.Size() > maxHistoryBytes {
		if err := os.Rename(path, path+".1"); err != nil {
			a.log.Warn("rotate migration history", "err", err)
		}
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		a.log.Warn("record migration", "err", err)
		return
	}
	defer f.Close()
	b, _ := json.Marshal(r)
	if _, err := f.Write(append(b, '\n')); err != nil {
		a.log.Warn("record migration", "err", err)
	}
}

// history calls fn with each recorded result, oldest first (the rotated
// file's, then the current one's), until fn returns false. A line that
// is not a result, or longer than maxHistoryLine, is skipped.
func (a *Agent) history(fn func(migration.Result) bool) error {
	path := filepath.Join(a.cfg.StateDir, historyFile)
	var errs []error
	found := false
	for _, p := range []string{path + ".1", path} {
		more, err := readHistory(p, fn)
		if err == nil {
			found = true
		} else if !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
		if !more {
			break
		}
	}
	if !found && len(errs) == 0 {
		return fs.ErrNotExist
	}
	return errors.Join(errs...)
}

// readHistory calls fn with each result in the file at path; more says
// whether fn wants more.
func readHistory(path string, fn func(migration.Result) bool) (more bool, err error) {
	f, err := os.Open(path)
	if err != nil {
		return true, err
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, 64<<10)
	for {
		line, err := readLine(br, maxHistoryLine)
		if len(line) > 0 {
			var r migration.Result
			if json.Unmarshal(line, &r) == nil && !fn(r) {
				return false, nil
			}
		}
		if err == io.EOF {
			return true, nil
		}
		if err != nil {
			return true, fmt.Errorf("%s: %w", path, err)
		}
	}
}

// readLine reads one line without its newline; a line longer than max
// is read past and returned empty.
func readLine(br *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	over := false
	for {
		part, err := br.ReadSlice('\n')
		if !over {
			if len(line)+len(part) > max+1 {
				over, line = true, nil
			} else {
				line = append(line, part...)
			}
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if over {
			return nil, err
		}
		return bytes.TrimSuffix(line, []byte("\n")), err
	}
}
