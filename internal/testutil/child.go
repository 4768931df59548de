package testutil

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// Child runs this test binary's test called name again, as a child
// process with the environment variable env set to value (the test sees
// it and plays the child's part), and returns once the child printed a
// line containing marker: the caller can then kill it at that point. The
// child is killed and waited for at cleanup. Its temporary directories
// (TMPDIR) lie in one of the caller's, removed with it: a killed child
// never removes its own.
func Child(t *testing.T, name, env, value, marker string) *os.Process {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+name+"$", "-test.v")
	cmd.Env = append(os.Environ(), env+"="+value, "TMPDIR="+t.TempDir())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	seen := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.Contains(sc.Text(), marker) {
				close(seen)
				break
			}
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	select {
	case <-seen:
	case <-time.After(20 * time.Second):
		t.Fatalf("the child process of %s never printed %q", name, marker)
	}
	return cmd.Process
}
