package testbed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/edgehop/edgehop/internal/agent"
	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/pki"
)

// Options configure where a testbed keeps its state and which binary runs
// its agents.
type Options struct {
	Root      string // state root, e.g. /var/lib/edgehop
	Binary    string // the edgehop binary started inside the namespaces
	ImageRoot string // OCI image cache the agents import from
	Log       *slog.Logger

	// AgentEnv adds environment variables to the agent of a node (by
	// name), e.g. a PATH with a fault-injecting runc wrapper in tests.
	AgentEnv map[string][]string
	// ScratchMB sizes a node's tmpfs for checkpoint images (0: half of
	// the machine's memory, tmpfs's default).
	ScratchMB map[string]int
}

// DefaultRoot is the default state root.
const DefaultRoot = "/var/lib/edgehop"

// Member is a node, a client or the core as recorded in State.
type Member struct {
	Name      string `json:"name"`
	NetNS     string `json:"netns"` // namespace name (ip netns)
	NetNSPath string `json:"netns_path"`
	Address   string `json:"address"` // underlay address
	Link      Link   `json:"link"`
	Index     int    `json:"index"`
	StateDir  string `json:"state_dir,omitempty"`
	Socket    string `json:"socket,omitempty"` // agent's local API
	API       string `json:"api,omitempty"`    // agent's peer API
	Range     string `json:"range,omitempty"`  // overlay range (nodes)
	AP        string `json:"ap,omitempty"`     // clients with APs: the access point its link ends on
	// AgentPID is the live pid of the member's agent (0: none running),
	// filled by Status.
	AgentPID int `json:"agent_pid,omitempty"`
}

// State is what Up recorded about a running testbed; Status returns it.
type State struct {
	Name      string   `json:"name"`
	Dir       string   `json:"dir"`
	Core      Member   `json:"core"`
	Nodes     []Member `json:"nodes"`
	Clients   []Member `json:"clients"`
	APs       []Member `json:"aps,omitempty"`
	Overlay   string   `json:"overlay"`
	Gateway   string   `json:"gateway"`
	LinkdSock string   `json:"linkd_socket"`
	// Controller is the testbed's controller; its URL is reachable from
	// the machine's root namespace (API and dashboard).
	Controller ControllerRef `json:"controller"`
	Created    time.Time     `json:"created"`
	Spec       Spec          `json:"spec"`
}

// ControllerRef is where a testbed's controller serves.
type ControllerRef struct {
	URL      string `json:"url"`       // operator API and dashboard, from the root namespace
	AgentURL string `json:"agent_url"` // agents' heartbeats (mutual TLS), from the nodes
	// TokenFile keeps the operator API's bearer token (mode 0600, made
	// by the controller at its first start).
	TokenFile string `json:"token_file,omitempty"`
	PID       int    `json:"pid,omitempty"` // filled by Status
}

// Errors callers branch on.
var (
	ErrExists   = errors.New("testbed already up")
	ErrNotFound = errors.New("testbed not found")
)

// Dir returns the state directory of testbed name under root.
func Dir(root, name string) string { return filepath.Join(root, "testbeds", name) }

func nsName(tb, member string) string { return "eh-" + tb + "-" + member }

// Load reads the recorded state of testbed name.
func Load(root, name string) (*State, error) {
	b, err := os.ReadFile(filepath.Join(Dir(root, name), "testbed.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %q (start it with 'edgehop testbed up')", ErrNotFound, name)
	}
	if err != nil {
		return nil, err
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("parse testbed state: %w", err)
	}
	return &st, nil
}

func (st *State) save() error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	return linux.WriteFileAtomic(filepath.Join(st.Dir, "testbed.json"), b, 0o644)
}

// Status is Load with the live process ids filled in: each agent's (from
// its pid file, 0 when it is not running) and the controller's.
func Status(root, name string) (*State, error) {
	st, err := Load(root, name)
	if err != nil {
		return nil, err
	}
	st.Core.AgentPID = livePID(filepath.Join(st.Core.StateDir, "agent.pid"))
	for i := range st.Nodes {
		st.Nodes[i].AgentPID = livePID(filepath.Join(st.Nodes[i].StateDir, "agent.pid"))
	}
	st.Controller.PID = livePID(filepath.Join(st.controllerDir(), "controller.pid"))
	return st, nil
}

// livePID reads a pid file and returns the pid if that process is alive.
func livePID(path string) int {
	if !alive(path) {
		return 0
	}
	b, _ := os.ReadFile(path)
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// Node returns the node member called name.
func (st *State) Node(name string) (Member, bool) {
	for _, m := range st.Nodes {
		if m.Name == name {
			return m, true
		}
	}
	return Member{}, false
}

// PathRate is the bit rate of the path between two members through the
// core: the narrower of their links, 0 when both are unshaped or a member
// is unknown.
func (st *State) PathRate(a, b string) uint64 {
	ma, oka := st.Member(a)
	mb, okb := st.Member(b)
	if !oka || !okb {
		return 0
	}
	return LinkPathRate(ma, mb)
}

// LinkPathRate is the bit rate of the path between members a and b: the
// narrower of their links, 0 when both are unshaped.
func LinkPathRate(a, b Member) uint64 {
	ra, rb := a.Link.RateBps, b.Link.RateBps
	switch {
	case ra == 0:
		return rb
	case rb == 0, ra < rb:
		return ra
	}
	return rb
}

// Member returns the node, client or core called name.
func (st *State) Member(name string) (Member, bool) {
	if name == "core" {
		return st.Core, true
	}
	for _, m := range append(append(append([]Member{}, st.Nodes...), st.Clients...), st.APs...) {
		if m.Name == name {
			return m, true
		}
	}
	return Member{}, false
}

// Up creates the testbed described by spec. On any failure it tears down
// what it created and returns the error.
func Up(ctx context.Context, spec Spec, o Options) (st *State, err error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	dir := Dir(o.Root, spec.Name)
	if _, err := os.Stat(filepath.Join(dir, "testbed.json")); err == nil {
		return nil, fmt.Errorf("%w: %q (run 'edgehop testbed down --testbed %s --root %s' first)", ErrExists, spec.Name, spec.Name, o.Root)
	}
	if matches, _ := filepath.Glob(linux.NetNSPath(nsName(spec.Name, "*"))); len(matches) > 0 {
		return nil, fmt.Errorf("%w: leftover namespaces %v (run 'edgehop testbed down --testbed %s')", ErrExists, matches, spec.Name)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create testbed dir: %w", err)
	}
	defer func() {
		if err != nil {
			if derr := Down(context.WithoutCancel(ctx), o.Root, spec.Name, log); derr != nil {
				err = errors.Join(err, fmt.Errorf("cleanup after failed up: %w", derr))
			}
		}
	}()

	st = &State{Name: spec.Name, Dir: dir, Spec: spec, Overlay: OverlayPrefix.String(), Gateway: OverlayGW.String(), Created: time.Now().UTC()}
	st.Core = Member{Name: "core", NetNS: nsName(spec.Name, "core"), NetNSPath: linux.NetNSPath(nsName(spec.Name, "core")), Address: CoreVTEP.String(), StateDir: filepath.Join(dir, "core")}
	if err := st.save(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(st.Core.StateDir, 0o755); err != nil {
		return nil, err
	}
	if err := linux.NewNetNS(st.Core.NetNSPath); err != nil {
		return nil, err
	}
	if err := setupCore(st.Core.NetNSPath); err != nil {
		return nil, fmt.Errorf("core: %w", err)
	}
	if err := guardCore(st.Core.NetNSPath); err != nil {
		return nil, fmt.Errorf("core: %w", err)
	}
	for i, e := range spec.Nodes {
		m := Member{Name: e.Name, Index: i, NetNS: nsName(spec.Name, e.Name), Address: NodeAddr(i).String(), Link: e.Link,
			StateDir: filepath.Join(dir, "nodes", e.Name), Range: NodeRange(i).String()}
		m.NetNSPath = linux.NetNSPath(m.NetNS)
		m.Socket = filepath.Join(m.StateDir, "agent.sock")
		m.API = net.JoinHostPort(m.Address, strconv.Itoa(AgentPort))
		if err := linux.NewNetNS(m.NetNSPath); err != nil {
			return nil, err
		}
		if err := wireLink(st.Core.NetNSPath, m.NetNSPath, e.Name, NodeCoreAddr(i), NodeAddr(i), NodeInitWindow); err != nil {
			return nil, fmt.Errorf("link %s: %w", e.Name, err)
		}
		st.Nodes = append(st.Nodes, m)
	}
	if err := setupAPs(st, spec); err != nil {
		return nil, err
	}
	for i, e := range spec.Clients {
		m := Member{Name: e.Name, Index: i, NetNS: nsName(spec.Name, e.Name), Address: ClientAddr(i).String(), Link: e.Link}
		m.NetNSPath = linux.NetNSPath(m.NetNS)
		if err := linux.NewNetNS(m.NetNSPath); err != nil {
			return nil, err
		}
		st.Clients = append(st.Clients, m)
		if len(st.APs) == 0 {
			if err := wireLink(st.Core.NetNSPath, m.NetNSPath, e.Name, ClientCoreAddr(i), ClientAddr(i), 0); err != nil {
				return nil, fmt.Errorf("link %s: %w", e.Name, err)
			}
			continue
		}
		ap := 0
		if e.AP != "" {
			ap, _ = st.APIndex(e.AP)
		}
		if err := attachClient(st, i, ap); err != nil {
			return nil, fmt.Errorf("link %s: %w", e.Name, err)
		}
	}
	if err := st.save(); err != nil {
		return nil, err
	}
	linkd, err := setupLinks(st, o)
	if err != nil {
		return nil, fmt.Errorf("link emulation: %w", err)
	}
	agents, ctl, err := prepareAgents(st, o)
	if err != nil {
		return nil, err
	}
	if err := st.save(); err != nil {
		return nil, err
	}
	if err := startSupervisor(st, o.Binary, append(append([]Proc{linkd}, agents...), ctl)); err != nil {
		return nil, fmt.Errorf("start supervisor: %w", err)
	}
	if err := waitLinkd(ctx, st); err != nil {
		return nil, fmt.Errorf("link emulation: %w", err)
	}
	for _, p := range agents {
		sock := filepath.Join(filepath.Dir(p.PIDFile), "agent.sock")
		if err := waitAgent(ctx, sock, p.Log, p.PIDFile); err != nil {
			return nil, fmt.Errorf("agent %s: %w", p.Name, err)
		}
	}
	if err := waitController(ctx, st); err != nil {
		return nil, err
	}
	log.Info("testbed up", "name", st.Name, "nodes", len(st.Nodes), "clients", len(st.Clients))
	return st, st.save()
}

// agentConfigs derives every agent's configuration from the state.
func agentConfigs(st *State, o Options) []agent.Config {
	var peers []agent.Peer
	peers = append(peers, agent.Peer{Name: "core", API: net.JoinHostPort(CoreVTEP.String(), strconv.Itoa(AgentPort)), VTEP: CoreVTEP})
	for _, n := range st.Nodes {
		peers = append(peers, agent.Peer{Name: n.Name, API: n.API, VTEP: NodeAddr(n.Index),
			Migrate: net.JoinHostPort(n.Address, strconv.Itoa(MigratePort))})
	}
	others := func(self string) []agent.Peer {
		var out []agent.Peer
		for _, p := range peers {
			if p.Name != self {
				out = append(out, p)
			}
		}
		return out
	}
	cfgs := []agent.Config{{
		Node: "core", Role: agent.RoleGateway, StateDir: st.Core.StateDir, Socket: filepath.Join(st.Core.StateDir, "agent.sock"),
		Listen: peers[0].API, VTEP: CoreVTEP, VNI: agent.DefaultVNI, Overlay: OverlayPrefix, Gateway: OverlayGW,
		Peers: others("core"), ImageRoot: o.ImageRoot, TLSDir: filepath.Join(st.Core.StateDir, "tls"),
	}}
	for _, n := range st.Nodes {
		cfgs = append(cfgs, agent.Config{
			Node: n.Name, Role: agent.RoleNode, StateDir: n.StateDir, Socket: n.Socket, Listen: n.API,
			VTEP: NodeAddr(n.Index), VNI: agent.DefaultVNI, Overlay: OverlayPrefix, Gateway: OverlayGW, Range: NodeRange(n.Index),
			Migrate:   net.JoinHostPort(n.Address, strconv.Itoa(MigratePort)),
			ScratchMB: o.ScratchMB[n.Name],
			Peers:     others(n.Name), ImageRoot: o.ImageRoot, TLSDir: filepath.Join(n.StateDir, "tls"),
		})
	}
	return cfgs
}

// prepareAgents writes every agent's configuration and certificate and
// returns the agent processes to start.
func prepareAgents(st *State, o Options) ([]Proc, Proc, error) {
	cfgs := agentConfigs(st, o)
	nsOf := map[string]string{"core": st.Core.NetNSPath}
	for _, n := range st.Nodes {
		nsOf[n.Name] = n.NetNSPath
	}
	st.Core.Socket = cfgs[0].Socket
	st.Core.API = cfgs[0].Listen
	// A per-testbed CA; each agent gets a certificate for its node name
	// and underlay address, for the mutually authenticated migration
	// stream. The CA key stays in the testbed's own directory.
	ca, err := pki.NewCA(filepath.Join(st.Dir, "ca"))
	if err != nil {
		return nil, Proc{}, fmt.Errorf("testbed CA: %w", err)
	}
	var procs []Proc
	for _, c := range cfgs {
		if err := ca.Issue(c.TLSDir, c.Node, []net.IP{c.VTEP.AsSlice()}); err != nil {
			return nil, Proc{}, fmt.Errorf("certificate for %s: %w", c.Node, err)
		}
		if err := os.MkdirAll(c.StateDir, 0o755); err != nil {
			return nil, Proc{}, err
		}
		if c.Role == agent.RoleNode {
			c.Controller = agentControllerURL()
		}
		b, _ := json.MarshalIndent(c, "", "  ")
		cfgPath := filepath.Join(c.StateDir, "agent.json")
		if err := os.WriteFile(cfgPath, b, 0o644); err != nil {
			return nil, Proc{}, err
		}
		procs = append(procs, Proc{Name: "agent " + c.Node, NetNS: nsOf[c.Node], Args: []string{o.Binary, "agent", "--config", cfgPath}, Env: o.AgentEnv[c.Node],
			Log: filepath.Join(c.StateDir, "agent.log"), PIDFile: filepath.Join(c.StateDir, "agent.pid")})
	}
	ctl, err := prepareController(st, o, ca)
	if err != nil {
		return nil, Proc{}, err
	}
	return procs, ctl, nil
}

// spawn starts binary in the namespace nsPath, detached in its own session,
// with output to logPath, and records its pid in pidPath.
func spawn(nsPath, logPath, pidPath, binary string, args ...string) error {
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer lf.Close()
	cmd := linux.Command(nsPath, binary, args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	go cmd.Wait() // reap it if it exits while we live; it outlives a CLI parent
	return os.WriteFile(pidPath, []byte(strconv.Itoa(cmd.Process.Pid)), 0o644)
}

func waitAgent(ctx context.Context, sock, logPath, pidPath string) error {
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}, Timeout: time.Second}
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := hc.Get("http://agent/v1/info")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if exited(pidPath) || time.Now().After(deadline) {
			tail, _ := os.ReadFile(logPath)
			lines := strings.Split(strings.TrimSpace(string(tail)), "\n")
			if len(lines) > 5 {
				lines = lines[len(lines)-5:]
			}
			return fmt.Errorf("not ready (log %s: %s)", logPath, strings.Join(lines, " | "))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// exited reports whether the process of pidPath was started and is gone
// (a missing pid file means not started yet).
func exited(pidPath string) bool {
	if _, err := os.Stat(pidPath); err != nil {
		return false
	}
	return !alive(pidPath)
}

func alive(pidPath string) bool {
	b, err := os.ReadFile(pidPath)
	if err != nil {
		return false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return false
	}
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// A zombie (state Z) is not alive.
	f := strings.Fields(string(st))
	return len(f) > 2 && f[2] != "Z"
}

// Exec returns a command running name inside member's namespace.
func (st *State) Exec(member string, name string, args ...string) (*exec.Cmd, error) {
	m, ok := st.Member(member)
	if !ok {
		return nil, fmt.Errorf("unknown testbed member %q (see 'edgehop testbed status')", member)
	}
	return linux.Command(m.NetNSPath, name, args...), nil
}
