package linux

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// SetChildSubreaper makes the calling process adopt (and so be able to
// reap) orphaned descendants instead of init.
func SetChildSubreaper() error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl child subreaper: %w", err)
	}
	return nil
}
