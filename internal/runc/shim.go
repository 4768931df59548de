package runc

import (
	"bufio"
	"context"
	"crypto/rand"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/rpc"
	"google.golang.org/protobuf/proto"

	"github.com/edgehop/edgehop/internal/linux"
)

// ShimName is the file name of edgehop's criu shim (cmd/edgehop-criu),
// installed next to the edgehop binary.
const ShimName = "edgehop-criu"

// GateLibName is the file name of the library the shim preloads into CRIU
// (cmd/edgehop-criu/gate.c), installed next to the shim: CRIU then starts
// before its gate opens and waits there, rather than after it.
const GateLibName = "edgehop-criu-gate.so"

// The shim's environment (see cmd/edgehop-criu).
const (
	shimEnvCRIU    = "EDGEHOP_CRIU"
	shimEnvVersion = "EDGEHOP_CRIU_VERSION"
	shimEnvGate    = "EDGEHOP_CRIU_GATE"
	shimEnvGateLib = "EDGEHOP_CRIU_GATE_LIB"
	gateEnvLevel   = "EDGEHOP_CRIU_LOG_LEVEL"
	gateEnvProbe   = "EDGEHOP_CRIU_GATE_PROBE"
	gateEnvLate    = "EDGEHOP_CRIU_GATE_LATE"
)

// lateGateCalls are the C library calls at which the gate library holds
// a CRIU that has prepared (cmd/edgehop-criu/gate.c): a dump's SIGALRM
// handler, alarm and PTRACE_SEIZE, a restore's first open of an image.
// CRIU must import them all for the library to stand in for them;
// otherwise CRIU waits in the library's constructor, before it reads the
// request.
var lateGateCalls = []string{"sigaction", "alarm", "ptrace", "openat64"}

// versionReplyFile is where, under Root, the Runtime keeps CRIU's reply
// to a version request for the shim to replay. runc lists only
// directories there.
const versionReplyFile = ".criu-version-reply"

// shimState is what a Runtime learnt once about its shim.
type shimState struct {
	once, gateOnce sync.Once
	version        string // path of CRIU's recorded version reply; "" if none
	gateLib        string // the gate library, checked to load into CRIU; "" if none
	// rlimits: the gate library answers CRIU's rlimit reads the kernel
	// refuses (its probe read /proc/self/limits as getrlimit does).
	rlimits bool
	// late: CRIU imports lateGateCalls, so it prepares before it waits.
	late bool
}

// shimEnv is the environment that makes runc use the shim: the real criu
// and, when recorded, CRIU's version reply.
func (r *Runtime) shimEnv(ctx context.Context, criu string) []string {
	r.shim.once.Do(func() {
		path := filepath.Join(r.Root, versionReplyFile)
		if err := recordVersionReply(ctx, criu, path); err != nil {
			r.logger().Warn("criu version reply not recorded; runc's version probe runs criu", "err", err)
			return
		}
		r.shim.version = path
	})
	r.shim.gateOnce.Do(func() {
		lib := filepath.Join(filepath.Dir(r.Shim), GateLibName)
		if _, err := os.Stat(lib); err != nil {
			r.logger().Info("no criu gate library; CRIU starts when its gate opens", "err", err)
			return
		}
		rlimits, err := probeGateLib(ctx, criu, lib)
		if err != nil {
			r.logger().Warn("criu does not load the gate library; CRIU starts when its gate opens", "lib", lib, "err", err)
			return
		}
		r.shim.gateLib, r.shim.rlimits = lib, rlimits
		if missing, err := missingImports(criu, lateGateCalls); err != nil || len(missing) > 0 {
			r.logger().Info("CRIU waits at its gate before it reads its request", "criu", criu, "missing", missing, "err", err)
			return
		}
		r.shim.late = true
	})
	env := []string{shimEnvCRIU + "=" + criu}
	if r.shim.version != "" {
		env = append(env, shimEnvVersion+"="+r.shim.version)
	}
	if r.shim.gateLib != "" {
		env = append(env, shimEnvGateLib+"="+r.shim.gateLib)
		if r.shim.late {
			env = append(env, gateEnvLate+"=1")
		}
		if r.CRIULogLevel > 0 {
			env = append(env, gateEnvLevel+"="+strconv.Itoa(r.CRIULogLevel))
		}
	}
	return env
}

// probeGateLib checks that criu loads lib and runs its constructor before
// main: asked to, the library answers for criu. A static criu ignores
// LD_PRELOAD, and would then not wait at the gate. rlimits reports that
// the library also read this process's /proc limits as getrlimit does,
// and so answers CRIU's rlimit reads the kernel refuses.
func probeGateLib(ctx context.Context, criu, lib string) (rlimits bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, criu, "--version")
	cmd.Env = append(os.Environ(), "LD_PRELOAD="+lib, gateEnvProbe+"=1")
	out, err := cmd.Output()
	switch got := string(out); got {
	case "edgehop-criu-gate\n":
		return false, nil
	case "edgehop-criu-gate\nrlimits\n":
		return true, nil
	default:
		first, _, _ := strings.Cut(got, "\n")
		return false, fmt.Errorf("criu --version with the library preloaded said %q (%v)", first, err)
	}
}

// missingImports returns those of names the ELF executable at path does
// not import from a shared library: a library preloaded into it can stand
// in only for calls it imports.
func missingImports(path string, names []string) ([]string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	syms, err := f.ImportedSymbols()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	have := map[string]bool{}
	for _, s := range syms {
		have[s.Name] = true
	}
	var missing []string
	for _, n := range names {
		if !have[n] {
			missing = append(missing, n)
		}
	}
	return missing, nil
}

// ReadsAnyRlimits reports whether this Runtime's CRIU reads the rlimits
// of processes running as any user, though the kernel refuses that to a
// root without CAP_SYS_RESOURCE: runc runs the shim, which preloads the
// gate library into CRIU, and the library answers such reads from
// /proc/PID/limits. Without, CRIU can dump only processes whose ids are
// its real ids (CheckpointOpts.RealIDs).
func (r *Runtime) ReadsAnyRlimits(ctx context.Context) bool {
	criu, err := r.criuPath()
	if err != nil {
		return false
	}
	if shim, _ := r.shimPath(); shim == "" {
		return false
	}
	r.shimEnv(ctx, criu)
	return r.shim.gateLib != "" && r.shim.rlimits
}

// WarmShim records CRIU's version reply for the shim now; otherwise the
// first runc command that runs CRIU records it, and on a destination that
// is a restore, inside the frozen window. A no-op without the shim.
func (r *Runtime) WarmShim(ctx context.Context) {
	criu, err := r.criuPath()
	if err != nil {
		return
	}
	if shim, _ := r.shimPath(); shim != "" {
		r.shimEnv(ctx, criu)
	}
}

// recordVersionReply asks criu for its version as runc does (a VERSION
// request to `criu swrk`) and stores the raw reply at path.
func recordVersionReply(ctx context.Context, criu, path string) error {
	client, server, err := linux.SeqpacketPair("criu-client", "criu-server")
	if err != nil {
		return fmt.Errorf("socketpair: %w", err)
	}
	defer client.Close()
	cmd := exec.CommandContext(ctx, criu, "swrk", "3")
	cmd.ExtraFiles = []*os.File{server}
	err = cmd.Start()
	server.Close()
	if err != nil {
		return fmt.Errorf("start criu swrk: %w", err)
	}
	defer func() { _ = cmd.Wait() }()
	req, err := proto.Marshal(&rpc.CriuReq{Type: rpc.CriuReqType_VERSION.Enum()})
	if err != nil {
		return err
	}
	if _, err := client.Write(req); err != nil {
		return fmt.Errorf("send version request: %w", err)
	}
	_ = client.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 4096)
	n, err := client.Read(buf)
	if err != nil {
		return fmt.Errorf("read version reply: %w", err)
	}
	var resp rpc.CriuResp
	if err := proto.Unmarshal(buf[:n], &resp); err != nil {
		return fmt.Errorf("version reply: %w", err)
	}
	if !resp.GetSuccess() || resp.GetType() != rpc.CriuReqType_VERSION || resp.GetVersion().GetMajorNumber() == 0 {
		return fmt.Errorf("criu gave no version (success %v, type %v)", resp.GetSuccess(), resp.GetType())
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return linux.WriteFileAtomic(path, buf[:n], 0o644)
}

// A Gate holds a checkpoint's CRIU back before it touches the container
// (CheckpointOpts.Gate): runc starts, asks for CRIU's version and prepares
// the dump while the service still runs, so that none of it falls in the
// frozen window. The caller waits for Ready, freezes the service, and
// calls Open; a checkpoint whose context ends first is called off with the
// container untouched. A restore's gate (RestoreOpts.Gate) holds CRIU
// back until the images are all there: runc starts, mounts and prepares
// while they are still on their way.
type Gate struct {
	ready, open         chan struct{}
	readyOnce, openOnce sync.Once
	// opening, when set (setOpening), runs in Open before the gate
	// opens; opened says Open began (both under mu).
	opening func()
	opened  bool
	// prepare, when set, runs when the gate opens, before CRIU is let
	// in; its failure calls CRIU off and is kept (prepared).
	prepare func() error
	mu      sync.Mutex
	prepErr error
}

// prepared is the failure of prepare that called CRIU off, if any.
func (g *Gate) prepared() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.prepErr
}

// NewGate returns a closed gate.
func NewGate() *Gate {
	return &Gate{ready: make(chan struct{}), open: make(chan struct{})}
}

// Ready is closed once CRIU waits at the gate (at once on a Runtime
// without the shim: runc then starts only when the gate opens).
func (g *Gate) Ready() <-chan struct{} { return g.ready }

// Open lets CRIU dump the container.
func (g *Gate) Open() {
	g.openOnce.Do(func() {
		g.mu.Lock()
		fn := g.opening
		g.opened = true
		g.mu.Unlock()
		if fn != nil {
			fn()
		}
		close(g.open)
	})
}

// setOpening makes fn run as the gate opens, or at once if it has: the
// restore sets it on its own goroutine while the caller may be opening.
func (g *Gate) setOpening(fn func()) {
	g.mu.Lock()
	if !g.opened {
		g.opening = fn
		g.mu.Unlock()
		return
	}
	g.mu.Unlock()
	fn()
}

func (g *Gate) markReady() { g.readyOnce.Do(func() { close(g.ready) }) }

// listenGate opens the gate's abstract unix socket in this network
// namespace (which runc and CRIU share) and serves the shim's one
// connection until stop is closed. It returns the socket's name.
func (g *Gate) listen(stop <-chan struct{}, log func(string, ...any)) (string, func(), error) {
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", nil, err
	}
	name := "edgehop-gate-" + hex.EncodeToString(b[:])
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: "@" + name, Net: "unix"})
	if err != nil {
		return "", nil, fmt.Errorf("gate socket: %w", err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		g.serve(l, stop, log)
	}()
	return name, func() { l.Close(); wg.Wait() }, nil
}

func (g *Gate) serve(l *net.UnixListener, stop <-chan struct{}, log func(string, ...any)) {
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-stop:
			l.Close()
		case <-done:
		}
	}()
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			return
		}
		if err := g.admit(c, stop); err != nil {
			log("criu gate", "err", err)
			c.Close()
			continue
		}
		c.Close()
		return
	}
}

// admit takes the shim's "ready" and answers "go" once the gate opens; a
// connection from anything but a root process is refused.
func (g *Gate) admit(c *net.UnixConn, stop <-chan struct{}) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	cred, err := linux.PeerCredentials(raw)
	if err != nil {
		return err
	}
	if cred.Uid != 0 {
		return fmt.Errorf("peer pid %d uid %d is not root", cred.Pid, cred.Uid)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || line != "ready\n" {
		return fmt.Errorf("peer pid %d said %q: %v", cred.Pid, line, err)
	}
	g.markReady()
	select {
	case <-g.open:
		if g.prepare != nil {
			if err := g.prepare(); err != nil {
				g.mu.Lock()
				g.prepErr = err
				g.mu.Unlock()
				return nil // closing calls CRIU off
			}
		}
		_, err := c.Write([]byte("go\n"))
		return err
	case <-stop:
		return nil // closing calls the dump off
	}
}

// shimPath resolves the shim; "" when the Runtime has none.
func (r *Runtime) shimPath() (string, error) {
	if r.Shim == "" {
		return "", nil
	}
	if _, err := os.Stat(r.Shim); err != nil {
		return "", fmt.Errorf("criu shim: %w", err)
	}
	return r.Shim, nil
}

// errGateClosed is a gated checkpoint called off before its gate opened.
var errGateClosed = errors.New("checkpoint called off before the freeze")

// gate readies g for a checkpoint: with the shim it returns the gate's
// socket name for the shim and a function that closes it; without, it
// marks g ready and waits for it to open (runc then starts only at the
// gate's opening).
func (r *Runtime) gate(ctx context.Context, g *Gate) (string, func(), error) {
	shim, err := r.shimPath()
	if err != nil {
		return "", nil, err
	}
	if shim == "" {
		g.markReady()
		select {
		case <-g.open:
			return "", nil, nil
		case <-ctx.Done():
			return "", nil, fmt.Errorf("%w: %w", errGateClosed, context.Cause(ctx))
		}
	}
	return g.listen(ctx.Done(), r.logger().Warn)
}
