package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgehop/edgehop/internal/api"
	"github.com/edgehop/edgehop/internal/journal"
	"github.com/edgehop/edgehop/internal/migration"
	"github.com/edgehop/edgehop/internal/netplane"
	"github.com/edgehop/edgehop/internal/pki"
	"github.com/edgehop/edgehop/internal/runc"
)

// peerAPI serves node0's peer API over real mutual TLS with a testbed-like
// CA; certDir returns the certificate directory of any node name issued.
type peerAPI struct {
	a   *Agent
	srv *httptest.Server
	dir string
}

func newPeerAPI(t testing.TB) *peerAPI {
	t.Helper()
	dir := t.TempDir()
	ca, err := pki.NewCA(filepath.Join(dir, "ca"))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"node0", "node1", "node2", "core", "stranger"} {
		if err := ca.Issue(filepath.Join(dir, n), n, []net.IP{net.IPv4(127, 0, 0, 1)}); err != nil {
			t.Fatal(err)
		}
	}
	cfg := validConfig()
	cfg.StateDir = dir
	cfg.TLSDir = filepath.Join(dir, "node0")
	cfg.Peers = []Peer{
		{Name: "core", API: "127.0.0.1:1", VTEP: netip.MustParseAddr("172.29.0.1")},
		{Name: "node1", API: "127.0.0.1:1", Migrate: "127.0.0.1:2", VTEP: netip.MustParseAddr("172.30.1.2")},
		{Name: "node2", API: "127.0.0.1:1", Migrate: "127.0.0.1:2", VTEP: netip.MustParseAddr("172.30.2.2")},
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if a.journal, err = journal.Open(filepath.Join(dir, "journal")); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(a.peerHandler())
	if srv.TLS, err = pki.ServerConfig(cfg.TLSDir); err != nil {
		t.Fatal(err)
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return &peerAPI{a: a, srv: srv, dir: dir}
}

// as returns an API client presenting node's certificate.
func (p *peerAPI) as(t *testing.T, node string) *api.Client {
	t.Helper()
	tlsCfg, err := pki.ClientConfig(filepath.Join(p.dir, node), "node0")
	if err != nil {
		t.Fatal(err)
	}
	return api.NewTCPClient(strings.TrimPrefix(p.srv.URL, "https://"), &http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg}})
}

func endpointOf(name, ip, node, vtep string) api.Endpoint {
	return api.Endpoint{Name: name, IP: ip, MAC: netplane.MACFor(netip.MustParseAddr(ip)).String(), VTEP: vtep, Node: node}
}

// Only configured peers get in, and a peer announces only its own
// endpoints at its own VTEP; the gateway announces none.
func TestPeerAPIIdentity(t *testing.T) {
	p := newPeerAPI(t)
	ctx := t.Context()
	if _, err := p.as(t, "node1").Endpoints(ctx); err != nil {
		t.Fatalf("a configured peer cannot read endpoints: %v", err)
	}
	if _, err := p.as(t, "stranger").Endpoints(ctx); !errors.Is(err, api.ErrForbidden) {
		t.Errorf("a certificate of an unconfigured node: err = %v, want forbidden", err)
	}
	// No client certificate at all: the handshake fails.
	plain := api.NewTCPClient(strings.TrimPrefix(p.srv.URL, "https://"), p.srv.Client())
	if _, err := plain.Endpoints(ctx); err == nil {
		t.Error("a client without a certificate read the endpoints")
	}
	for name, tc := range map[string]struct {
		as string
		e  api.Endpoint
	}{
		"another node's endpoint":    {"node1", endpointOf("s", "10.200.2.5", "node2", "172.30.2.2")},
		"another node's VTEP":        {"node1", endpointOf("s", "10.200.2.5", "node1", "172.30.2.2")},
		"the gateway announcing":     {"core", endpointOf("s", "10.200.2.5", "core", "172.29.0.1")},
		"a MAC not of its address":   {"node1", api.Endpoint{Name: "s", IP: "10.200.1.5", MAC: "02:00:00:00:00:01", VTEP: "172.30.1.2", Node: "node1"}},
		"an address off the overlay": {"node1", endpointOf("s", "192.0.2.5", "node1", "172.30.1.2")},
		"a name that is a path":      {"node1", endpointOf("../../x", "10.200.1.5", "node1", "172.30.1.2")},
	} {
		err := p.as(t, tc.as).Announce(ctx, tc.e)
		if !errors.Is(err, api.ErrForbidden) && !errors.Is(err, api.ErrInvalid) {
			t.Errorf("%s: Announce err = %v, want forbidden or invalid", name, err)
		}
		if err := p.as(t, tc.as).Withdraw(ctx, tc.e); !errors.Is(err, api.ErrForbidden) && !errors.Is(err, api.ErrInvalid) {
			t.Errorf("%s: Withdraw err = %v, want forbidden or invalid", name, err)
		}
	}
	// The operator's routes do not exist on the peer API.
	for _, route := range []struct{ method, path string }{
		{http.MethodPost, "/v1/containers"}, {http.MethodDelete, "/v1/containers/x"},
		{http.MethodPost, "/v1/migrations"}, {http.MethodGet, "/v1/containers"}, {http.MethodGet, "/metrics"},
		{http.MethodGet, "/debug/pprof/goroutine"},
	} {
		err := p.as(t, "node1").Do(ctx, route.method, route.path, map[string]string{}, nil)
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Code == "" {
			t.Errorf("%s %s on the peer API: err = %v, want a refusal", route.method, route.path, err)
		}
	}
}

// A peer's endpoint list passes the checks its announcements get: only
// its own endpoints, at its own VTEP, on the overlay.
func TestEndpointListChecked(t *testing.T) {
	p := newPeerAPI(t)
	own := endpointOf("s", "10.200.2.5", "node1", "172.30.1.2")
	list := []api.Endpoint{
		own,
		endpointOf("t", "10.200.2.6", "node2", "172.30.2.2"), // another node's
		endpointOf("u", "10.200.2.7", "node1", "172.30.2.2"), // another VTEP
		endpointOf("v", "192.0.2.5", "node1", "172.30.1.2"),  // off the overlay
	}
	if got := p.a.checkListed("node1", list); len(got) != 1 || got[0] != own {
		t.Errorf("node1's list: kept %+v, want only %+v", got, own)
	}
	if got := p.a.checkListed("core", list); len(got) != 0 {
		t.Errorf("the gateway's list: kept %+v, want none", got)
	}
	if got := p.a.checkListed("stranger", list); len(got) != 0 {
		t.Errorf("an unconfigured node's list: kept %+v, want none", got)
	}
}

// A journal phase is told only to the other side of that migration.
func TestPeerAPIJournalPhase(t *testing.T) {
	p := newPeerAPI(t)
	id := journal.NewID()
	if _, err := p.a.journal.Put(journal.Record{ID: id, Role: migration.RoleSource, Container: "redis", Peer: "node1",
		Strategy: migration.StopAndCopy, Phase: migration.Committed}); err != nil {
		t.Fatal(err)
	}
	ph, err := p.as(t, "node1").PeerPhase(t.Context(), id)
	if err != nil || ph.Phase != string(migration.Committed) {
		t.Fatalf("PeerPhase = %+v, %v", ph, err)
	}
	if _, err := p.as(t, "node2").PeerPhase(t.Context(), id); !errors.Is(err, api.ErrForbidden) {
		t.Errorf("a third node asked: err = %v, want forbidden", err)
	}
	if _, err := p.as(t, "node1").PeerPhase(t.Context(), journal.NewID()); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("unknown id: err = %v, want not found", err)
	}
	b, _ := json.Marshal(ph)
	if !strings.Contains(string(b), id) {
		t.Errorf("answer %s lacks the id", b)
	}
	// A record that cannot be read is not "no such migration": the peer
	// would take that for "gave up" and destroy its copy.
	log := filepath.Join(p.a.journal.Dir(), id+".log")
	if err := os.WriteFile(log, []byte("garbage\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = p.as(t, "node1").PeerPhase(t.Context(), id)
	var ae *api.Error
	if err == nil || errors.Is(err, api.ErrNotFound) || !errors.As(err, &ae) || ae.Code != "internal" {
		t.Errorf("unreadable record: err = %v, want an internal error, not not-found", err)
	}
}

func TestValidatePrepare(t *testing.T) {
	p := newPeerAPI(t)
	ok := migration.Prepare{ID: journal.NewID(), Name: "redis", Image: "services", Digest: "sha256:" + strings.Repeat("ab", 32),
		IP: "10.200.1.5", MAC: netplane.MACFor(netip.MustParseAddr("10.200.1.5")).String(), Args: []string{"redis-server"},
		Strategy: migration.StopAndCopy, From: "node1", MemoryBytes: 1 << 20,
		Process: migration.Process{User: "nobody", UID: 65534, GID: 65534, StopSignal: "SIGTERM", Ports: []string{"6379/tcp", "53/udp", "8080"},
			Volumes: []string{"/data", "/var/lib/redis"}}}
	if err := p.a.validatePrepare(ok, "node1"); err != nil {
		t.Fatalf("valid prepare refused: %v", err)
	}
	for name, mut := range map[string]func(*migration.Prepare){
		"claims another sender": func(m *migration.Prepare) { m.From = "node2" },
		"path as name":          func(m *migration.Prepare) { m.Name = "../../.." },
		"bad digest":            func(m *migration.Prepare) { m.Digest = "sha256:xyz" },
		"address off overlay":   func(m *migration.Prepare) { m.IP = "192.0.2.1" },
		"gateway address":       func(m *migration.Prepare) { m.IP = "10.200.0.1" },
		"foreign MAC":           func(m *migration.Prepare) { m.MAC = "02:00:00:00:00:01" },
		"auto strategy":         func(m *migration.Prepare) { m.Strategy = migration.Auto },
		"no args":               func(m *migration.Prepare) { m.Args = nil },
		"negative memory":       func(m *migration.Prepare) { m.MemoryBytes = -1 },
		"page server off host": func(m *migration.Prepare) {
			m.Strategy, m.PageServer, m.PageToken = migration.PostCopy, "10.0.0.1:80", strings.Repeat("a", 32)
		},
		"relative cwd":    func(m *migration.Prepare) { m.Cwd = "tmp" },
		"bad id":          func(m *migration.Prepare) { m.ID = "1" },
		"bad stop signal": func(m *migration.Prepare) { m.StopSignal = "SIGNOPE" },
		"bad port":        func(m *migration.Prepare) { m.Ports = []string{"80/tcp; rm -rf /"} },
		"too many groups": func(m *migration.Prepare) { m.Groups = make([]uint32, 65) },
		"overlong user":   func(m *migration.Prepare) { m.User = strings.Repeat("u", 300) },
		"pod outside a group": func(m *migration.Prepare) {
			m.PodNet = "redis"
		},
		"pod network left behind": func(m *migration.Prepare) {
			m.Group, m.PodNet, m.Unit, m.Members = "app", "db", journal.NewID(), []string{"redis"}
		},
		"pod network a path": func(m *migration.Prepare) {
			m.Group, m.PodNet, m.Unit, m.Members = "app", "../db", journal.NewID(), []string{"redis", "../db"}
		},
	} {
		m := ok
		m.Args = append([]string{}, ok.Args...)
		mut(&m)
		if err := p.a.validatePrepare(m, "node1"); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if err := p.a.validatePrepare(ok, "core"); err == nil {
		t.Error("a prepare from the gateway accepted")
	}
	pod := ok
	pod.Group, pod.PodNet, pod.Unit, pod.Members = "app", "db", journal.NewID(), []string{"db", "redis"}
	if err := p.a.validatePrepare(pod, "node1"); err != nil {
		t.Errorf("a pod member moving with its pod's first refused: %v", err)
	}
}

func TestDumpIDs(t *testing.T) {
	type ids struct{ u, g [3]int }
	same := func(u, g int) ids { return ids{[3]int{u, u, u}, [3]int{g, g, g}} }
	cases := []struct {
		name  string
		procs []ids
		want  *runc.IDs
		err   string
	}{
		{"root service", []ids{same(0, 0), same(0, 0)}, nil, ""},
		{"one non-root user", []ids{same(65534, 65534)}, &runc.IDs{UID: 65534, GID: 65534}, ""},
		{"dropped to its user after start", []ids{same(101, 102), same(101, 102)}, &runc.IDs{UID: 101, GID: 102}, ""},
		{"root group, user not", []ids{same(100, 0)}, &runc.IDs{UID: 100, GID: 0}, ""},
		{"root master with workers", []ids{same(0, 0), same(33, 33)}, nil, "different users"},
		{"workers differ in group", []ids{same(33, 33), same(33, 34)}, nil, "different users"},
		{"setuid half done", []ids{{[3]int{0, 100, 0}, [3]int{0, 0, 0}}}, nil, "real, effective and saved ids differ"},
		{"nothing readable", nil, nil, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pids := make([]int, len(c.procs))
			for i := range pids {
				pids[i] = i + 1
			}
			got, err := dumpIDs("svc", pids, 0, 0, func(pid int) ([3]int, [3]int, error) {
				p := c.procs[pid-1]
				return p.u, p.g, nil
			})
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) || !errors.Is(err, ErrInvalid) {
					t.Fatalf("err = %v, want ErrInvalid containing %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (got == nil) != (c.want == nil) || (got != nil && *got != *c.want) {
				t.Fatalf("got %+v, want %+v", got, c.want)
			}
		})
	}
}

// TestOperatorListener: over TCP the operator API admits operator
// certificates of the deployment's CA only; a node's certificate (or
// none) gets nothing.
func TestOperatorListener(t *testing.T) {
	p := newPeerAPI(t)
	ca, err := pki.NewCA(filepath.Join(p.dir, "ca"))
	if err != nil {
		t.Fatal(err)
	}
	opDir := filepath.Join(p.dir, "op")
	if err := ca.IssueOperator(opDir, "alice"); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(operatorOnly(p.a.operatorHandler()))
	if srv.TLS, err = pki.OperatorServerConfig(p.a.cfg.TLSDir); err != nil {
		t.Fatal(err)
	}
	srv.StartTLS()
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "https://")
	opCfg, err := pki.OperatorClientConfig(opDir, "node0")
	if err != nil {
		t.Fatal(err)
	}
	op := api.NewTCPClient(addr, &http.Client{Transport: &http.Transport{TLSClientConfig: opCfg}})
	if _, err := op.Jobs(t.Context()); err != nil {
		t.Fatalf("operator refused: %v", err)
	}
	// The agent's own profiles are the operator's.
	var prof bytes.Buffer
	if err := op.Do(t.Context(), http.MethodGet, "/debug/pprof/goroutine", nil, &prof); err != nil || prof.Len() == 0 {
		t.Fatalf("goroutine profile: %d bytes, %v", prof.Len(), err)
	}
	nodeCfg, err := pki.ClientConfig(filepath.Join(p.dir, "node1"), "node0")
	if err != nil {
		t.Fatal(err)
	}
	node := api.NewTCPClient(addr, &http.Client{Transport: &http.Transport{TLSClientConfig: nodeCfg}})
	if err := node.Do(t.Context(), http.MethodGet, "/debug/pprof/goroutine", nil, io.Discard); err == nil {
		t.Fatal("a node's certificate read the agent's profile")
	}
	if _, err := node.Jobs(t.Context()); err == nil {
		t.Fatal("a node's certificate drove the operator API")
	}
	// Without TLS, the handler itself refuses.
	plain := httptest.NewServer(operatorOnly(p.a.operatorHandler()))
	defer plain.Close()
	resp, err := http.Get(plain.URL + "/v1/migrations")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("plain HTTP got %d, want 403", resp.StatusCode)
	}
}

// The volumes' directory of a writable layer is masked in every
// container, so a service sees its volumes only where they are bound.
func TestVolumesDirMasked(t *testing.T) {
	for _, d := range runc.MaskedDirs {
		if d == "/"+migration.VolumesDir {
			return
		}
	}
	t.Fatalf("%s is not among the masked directories %v", migration.VolumesDir, runc.MaskedDirs)
}
