package runc

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// ErrNotFound is returned (wrapped) when runc has no container with the
// given id under the Runtime's root.
var ErrNotFound = errors.New("container not found")

// ErrNotSupported is returned (wrapped, with the reason) when this machine
// cannot do what was asked: runc or criu is missing, `criu check` fails, or
// a kernel feature that CRIU needs is absent. Tests turn it into a skip.
var ErrNotSupported = errors.New("not supported on this machine")

// Error is a failed runc invocation. It carries runc's own error messages
// and, for checkpoint and restore, the reason CRIU gave in its log.
type Error struct {
	Op  string // runc subcommand: "run", "checkpoint", ...
	ID  string // container id
	Msg string // runc's error messages, joined
	// CRIULog is the CRIU log file of a failed checkpoint or restore
	// (empty for other operations or when it was not written).
	CRIULog string
	// CRIUReason holds CRIU's error lines from CRIULog, or its last lines
	// when no line is marked as an error.
	CRIUReason string
	Err        error // the exec error, or ErrNotFound
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "runc %s %s", e.Op, e.ID)
	if e.Msg != "" {
		b.WriteString(": ")
		b.WriteString(e.Msg)
	}
	var exit *exec.ExitError
	if e.Err != nil && (e.Msg == "" || !errors.As(e.Err, &exit)) {
		// runc's message says more than its exit status.
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	if e.CRIUReason != "" {
		fmt.Fprintf(&b, "; criu log %s: %s", e.CRIULog, e.CRIUReason)
	}
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// runcLogMessages returns the error-level messages of a runc log written
// with --log-format json, falling back to the raw text when the file is
// not JSON lines.
func runcLogMessages(data []byte) string {
	var msgs []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var ent struct {
			Level string `json:"level"`
			Msg   string `json:"msg"`
		}
		if err := json.Unmarshal(line, &ent); err != nil {
			msgs = append(msgs, string(line))
			continue
		}
		if ent.Level == "error" || ent.Level == "fatal" || ent.Level == "panic" {
			// runc's CRIU errors span lines ("criu failed: ...\nlog file: ...").
			msgs = append(msgs, strings.Join(strings.Fields(ent.Msg), " "))
		}
	}
	return strings.Join(dedup(msgs), "; ")
}

func dedup(in []string) []string {
	seen := make(map[string]bool, len(in))
	var out []string
	for _, s := range in {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

// criuReason extracts from a CRIU log the lines CRIU marked as errors (at
// most maxErrorLines, the first ones being the cause), or the last
// tailLines lines when none is marked. It reads only the end of big logs.
func criuReason(path string) string {
	const (
		maxRead       = 256 * 1024
		maxErrorLines = 8
		tailLines     = 10
	)
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > maxRead {
		if _, err := f.Seek(st.Size()-maxRead, 0); err != nil {
			return ""
		}
	}
	var errs, all []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		all = append(all, line)
		if harmlessCRIUError(line) {
			continue
		}
		if strings.Contains(line, "Error (") || strings.Contains(line, "Error:") {
			errs = append(errs, line)
		}
	}
	if len(errs) > 0 {
		if len(errs) > maxErrorLines {
			errs = errs[:maxErrorLines]
		}
		return strings.Join(errs, "; ")
	}
	if len(all) > tailLines {
		all = all[len(all)-tailLines:]
	}
	return strings.Join(all, "; ")
}

// harmlessCRIUError reports CRIU error lines that every run prints here and
// that never explain a failure: without CAP_SYS_RESOURCE CRIU cannot raise
// its own RLIMIT_NOFILE and carries on.
func harmlessCRIUError(line string) bool {
	return strings.Contains(line, "Can't setup RLIMIT_NOFILE")
}
