package precopy

import (
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		// Re-executed as the memory-writing child of a test.
		if err := runHelper(); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(runTests(m))
}

// runTests runs the tests, then fails if goroutines or file descriptors
// outlive them (a round's pipe reader, a store file, a pagemap).
func runTests(m *testing.M) int {
	fds, goroutines := countFDs(), runtime.NumGoroutine()
	code := m.Run()
	if code != 0 {
		return code
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		nfds, ngo := countFDs(), runtime.NumGoroutine()
		if nfds <= fds && ngo <= goroutines {
			return 0
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(os.Stderr, "leak: %d fds (was %d), %d goroutines (was %d)\n", nfds, fds, ngo, goroutines)
			buf := make([]byte, 1<<20)
			os.Stderr.Write(buf[:runtime.Stack(buf, true)])
			return 1
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func countFDs() int {
	ents, _ := os.ReadDir("/proc/self/fd")
	return len(ents)
}
