package runc

import "github.com/edgehop/edgehop/internal/linux"

// statsDumpFile is the image CRIU writes last, and only when a dump
// succeeded (cr_dump_finish's write_stats).
const statsDumpFile = "stats-dump"

// watchWritten calls fn (once, on its own goroutine) when a file named
// name is written and closed in dir, or moved there. The returned
// function stops the watch and waits for fn to have returned.
func watchWritten(dir, name string, fn func()) (func(), error) {
	return linux.WatchWritten(dir, func(n string) bool {
		if n != name {
			return true
		}
		fn()
		return false
	}, nil)
}
