package linux

import (
	"syscall"
	"testing"
)

func TestParseSignal(t *testing.T) {
	for in, want := range map[string]syscall.Signal{"SIGTERM": syscall.SIGTERM, "term": syscall.SIGTERM, "SIGQUIT": syscall.SIGQUIT, "2": syscall.SIGINT} {
		if got, err := ParseSignal(in); err != nil || got != want {
			t.Errorf("ParseSignal(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "SIGNOPE", "0", "65", "-1"} {
		if got, err := ParseSignal(in); err == nil {
			t.Errorf("ParseSignal(%q) = %v, want an error", in, got)
		}
	}
}
