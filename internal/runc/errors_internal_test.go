package runc

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestRuncLogMessages(t *testing.T) {
	tests := []struct {
		name, log, want string
	}{
		{"json errors only",
			`{"level":"warning","msg":"ignored","time":"x"}` + "\n" +
				`{"level":"error","msg":"criu failed: type NOTIFY errno 0\nlog file: /w/dump.log","time":"x"}` + "\n" +
				`{"level":"error","msg":"criu failed: type NOTIFY errno 0\nlog file: /w/dump.log","time":"x"}` + "\n",
			"criu failed: type NOTIFY errno 0 log file: /w/dump.log"},
		{"plain text", "container does not exist\n", "container does not exist"},
		{"empty", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := runcLogMessages([]byte(tt.log)); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestCRIUReason(t *testing.T) {
	tests := []struct {
		name, log, want string
	}{
		{"error lines, harmless rlimit dropped",
			"(00.000001) Version: 4.2.1\n" +
				"(00.033969) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted\n" +
				"(00.033992) Error (criu/image.c:563): Magic doesn't match for inventory.img\n" +
				"(00.034000) Something else\n",
			"(00.033992) Error (criu/image.c:563): Magic doesn't match for inventory.img"},
		{"no error lines: tail",
			strings.Repeat("(00.1) line\n", 20) + "(00.2) last\n",
			strings.Repeat("(00.1) line; ", 9) + "(00.2) last"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "dump.log")
			if err := os.WriteFile(p, []byte(tt.log), 0o600); err != nil {
				t.Fatal(err)
			}
			if got := criuReason(p); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
	if got := criuReason(filepath.Join(t.TempDir(), "none.log")); got != "" {
		t.Errorf("missing log gave %q", got)
	}
}

func TestErrorText(t *testing.T) {
	exit := &exec.ExitError{}
	e := &Error{Op: "restore", ID: "c1", Msg: "criu failed", Err: exit,
		CRIULog: "/w/restore.log", CRIUReason: "Error (x): bad"}
	if got, want := e.Error(), "runc restore c1: criu failed; criu log /w/restore.log: Error (x): bad"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	nf := &Error{Op: "state", ID: "c2", Msg: "container does not exist", Err: ErrNotFound}
	if !errors.Is(nf, ErrNotFound) || !strings.Contains(nf.Error(), "container not found") {
		t.Errorf("not-found error %q", nf)
	}
}
