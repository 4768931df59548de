package runc

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/rpc"
	"google.golang.org/protobuf/proto"

	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/testutil"
)

// BuildShimForTest returns the criu shim: the one next to $EDGEHOP_BIN
// when it is there, else built from source into a temp dir. It skips the test when
// neither works (no C compiler).
func BuildShimForTest(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("EDGEHOP_BIN"); bin != "" {
		p := filepath.Join(filepath.Dir(bin), ShimName)
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	p := filepath.Join(t.TempDir(), ShimName)
	if err := testutil.BuildCRIUShim(p); errors.Is(err, testutil.ErrNoCC) {
		t.Skipf("skipped: %v", err)
	} else if err != nil {
		t.Fatal(err)
	}
	return p
}

// swrk runs the shim as runc does (`swrk 3` on a SOCK_SEQPACKET pair) with
// env, sends req and returns the reply (nil when the shim exited without
// one) and how the shim exited.
func swrk(t *testing.T, shim string, env []string, req []byte) ([]byte, error) {
	t.Helper()
	client, server, err := linux.SeqpacketPair("client", "server")
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	cmd := exec.Command(shim, "swrk", "3")
	cmd.Env = env
	cmd.ExtraFiles = []*os.File{server}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	server.Close()
	if _, err := client.Write(req); err != nil {
		return nil, errors.Join(err, cmd.Wait()) // the shim exited first
	}
	_ = client.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 4096)
	n, _ := client.Read(buf)
	werr := cmd.Wait()
	if n <= 0 {
		return nil, werr
	}
	return buf[:n], werr
}

// TestShimVersion: the shim answers runc's version probe with the reply
// recorded from the real criu, without running criu (EDGEHOP_CRIU is
// /bin/false here); any other request goes to EDGEHOP_CRIU.
func TestShimVersion(t *testing.T) {
	testutil.RequireRoot(t)
	shim := BuildShimForTest(t)
	criu, err := exec.LookPath("criu")
	if err != nil {
		t.Skip("skipped: criu not installed (run 'make setup')")
	}
	reply := filepath.Join(t.TempDir(), "runc", versionReplyFile)
	if err := recordVersionReply(context.Background(), criu, reply); err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(reply)
	if err != nil {
		t.Fatal(err)
	}
	var resp rpc.CriuResp
	if err := proto.Unmarshal(want, &resp); err != nil || resp.GetVersion().GetMajorNumber() < 4 {
		t.Fatalf("recorded reply %x: %v, version %v", want, err, resp.GetVersion())
	}
	version, _ := proto.Marshal(&rpc.CriuReq{Type: rpc.CriuReqType_VERSION.Enum()})
	check, _ := proto.Marshal(&rpc.CriuReq{Type: rpc.CriuReqType_CHECK.Enum()})
	env := []string{shimEnvCRIU + "=/bin/false", shimEnvVersion + "=" + reply}

	got, err := swrk(t, shim, env, version)
	if err != nil || !bytes.Equal(got, want) {
		t.Errorf("version request: reply %x (exit %v), want %x and exit 0", got, err, want)
	}
	// Not a version request: /bin/false runs, and fails.
	if got, err := swrk(t, shim, env, check); err == nil || got != nil {
		t.Errorf("check request: reply %x exit %v, want EDGEHOP_CRIU (/bin/false) run", got, err)
	}
	// No recorded reply: the real criu answers.
	got, err = swrk(t, shim, []string{shimEnvCRIU + "=" + criu}, version)
	if err != nil || proto.Unmarshal(got, &resp) != nil || resp.GetVersion().GetMajorNumber() < 4 {
		t.Errorf("version from criu: reply %x exit %v", got, err)
	}
	// A relative EDGEHOP_CRIU is refused.
	if _, err := swrk(t, shim, []string{shimEnvCRIU + "=criu"}, version); err == nil {
		t.Error("shim ran with a relative EDGEHOP_CRIU")
	}
}

// TestMissingImports: the late gate needs CRIU to import the calls the
// gate library stands in for. Stock CRIU does; ls imports no ptrace.
func TestMissingImports(t *testing.T) {
	if criu, err := exec.LookPath("criu"); err == nil {
		missing, err := missingImports(criu, lateGateCalls)
		if err != nil || len(missing) > 0 {
			t.Errorf("%s: missing %v, %v; want none", criu, missing, err)
		}
	} else {
		t.Log("no criu here: its imports not checked")
	}
	ls, err := exec.LookPath("ls")
	if err != nil {
		t.Skipf("skipped: no ls to read: %v", err)
	}
	missing, err := missingImports(ls, []string{"ptrace", "opendir"})
	if err != nil || len(missing) != 1 || missing[0] != "ptrace" {
		t.Errorf("%s: missing %v, %v; want [ptrace]", ls, missing, err)
	}
	if _, err := missingImports(filepath.Join(t.TempDir(), "none"), lateGateCalls); err == nil {
		t.Error("no error for a file that is not there")
	}
}
