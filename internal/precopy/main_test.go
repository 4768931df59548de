package precopy

import (
	"fmt"
	"os"
	"testing"

	"github.com/edgehop/edgehop/internal/testutil"
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
	os.Exit(testutil.RunCheckingLeaks(m))
}
