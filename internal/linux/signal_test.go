package linux

import (
	"os"
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

func TestSNMPField(t *testing.T) {
	text := "Ip: Forwarding DefaultTTL\nIp: 1 64\nTcp: RtoAlgorithm RtoMin ActiveOpens PassiveOpens AttemptFails\nTcp: 1 200 7 42 0\nUdp: InDatagrams\nUdp: 3\n"
	if n, err := snmpField(text, "Tcp", "PassiveOpens"); err != nil || n != 42 {
		t.Errorf("PassiveOpens = %d, %v; want 42", n, err)
	}
	if _, err := snmpField(text, "Tcp", "Nope"); err == nil {
		t.Error("a missing counter read without error")
	}
	if n, err := PassiveOpens(os.Getpid()); err != nil || n < 0 {
		t.Errorf("this process's namespace: %d, %v", n, err)
	}
}
