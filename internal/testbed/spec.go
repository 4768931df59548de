package testbed

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"time"

	"github.com/edgehop/edgehop/internal/topo"
)

// Link describes one emulated link between a node or client and the core.
type Link struct {
	RateBps uint64        `json:"rate_bps"`  // 0 = unshaped
	Delay   time.Duration `json:"delay_ns"`  // one way, each direction
	Jitter  time.Duration `json:"jitter_ns"` // uniform ±, never reorders
	Loss    float64       `json:"loss"`      // probability 0..1, each direction
}

// Endpoint is a node, a client or an access point with its link: to the
// core (nodes, APs; clients when there are no APs) or to its access point
// (clients when there are APs).
type Endpoint struct {
	Name string `json:"name"`
	Link Link   `json:"link"`
	// AP is the access point a client starts on ("" : the first).
	AP string `json:"ap,omitempty"`
}

// Spec is the serialisable description of a testbed.
type Spec struct {
	Name    string     `json:"name"`
	Nodes   []Endpoint `json:"nodes"`
	Clients []Endpoint `json:"clients"`
	// APs are access points, each a namespace of its own on a link to
	// the core. With APs, every client's link ends on an AP (its virtual
	// AP), and moves from AP to AP keeping its addresses (Handoff).
	APs []Endpoint `json:"aps,omitempty"`
	// Plane places regions, APs and nodes on a plane for the controller;
	// nil: World() lays them out along a line.
	Plane *topo.Topology `json:"world,omitempty"`
}

// Address plan. Node k's link is 172.30.k.0/24 (core .1, node .2), client
// k's 172.31.k.0/24; the core's VTEP is 172.29.0.1; the overlay (service
// network) is 10.200.0.0/16 with the gateway 10.200.0.1 in the core and node
// k allocating container addresses from 10.200.(k+1).0/24.
var (
	CoreVTEP      = netip.MustParseAddr("172.29.0.1")
	OverlayPrefix = netip.MustParsePrefix("10.200.0.0/16")
	OverlayGW     = netip.MustParseAddr("10.200.0.1")
)

// MaxNodes, MaxClients and MaxAPs bound the address plan.
const (
	MaxNodes   = 200
	MaxClients = 200
	MaxAPs     = 200
)

// DefaultNodeLink is a 1 Gbit/s edge backhaul with 1 ms one way.
var DefaultNodeLink = Link{RateBps: 1_000_000_000, Delay: time.Millisecond}

// DefaultClientLink is a 100 Mbit/s access link with 5 ms one way.
var DefaultClientLink = Link{RateBps: 100_000_000, Delay: 5 * time.Millisecond}

// DefaultSpec returns a testbed named name with n nodes (node0…) and m
// clients (client0…) on the default links.
func DefaultSpec(name string, n, m int) Spec {
	s := Spec{Name: name}
	for i := 0; i < n; i++ {
		s.Nodes = append(s.Nodes, Endpoint{Name: fmt.Sprintf("node%d", i), Link: DefaultNodeLink})
	}
	for i := 0; i < m; i++ {
		s.Clients = append(s.Clients, Endpoint{Name: fmt.Sprintf("client%d", i), Link: DefaultClientLink})
	}
	return s
}

var nameRE = regexp.MustCompile(`^[a-z][a-z0-9]{0,9}$`)

// CheckName returns an error unless name can name a testbed (or one of
// its members): 1-10 lowercase letters and digits, starting with a letter.
func CheckName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("testbed name %q: want 1-10 lowercase letters/digits starting with a letter", name)
	}
	return nil
}

// ErrInvalidSpec is wrapped by every Validate failure.
var ErrInvalidSpec = errors.New("invalid testbed spec")

// Validate checks the spec: names, sizes and link parameters.
func (s Spec) Validate() error {
	var errs []error
	if err := CheckName(s.Name); err != nil {
		errs = append(errs, err)
	}
	if len(s.Nodes) == 0 || len(s.Nodes) > MaxNodes {
		errs = append(errs, fmt.Errorf("nodes: want 1..%d, got %d", MaxNodes, len(s.Nodes)))
	}
	if len(s.Clients) > MaxClients {
		errs = append(errs, fmt.Errorf("clients: want 0..%d, got %d", MaxClients, len(s.Clients)))
	}
	if len(s.APs) > MaxAPs {
		errs = append(errs, fmt.Errorf("aps: want 0..%d, got %d", MaxAPs, len(s.APs)))
	}
	aps := map[string]bool{}
	for _, a := range s.APs {
		aps[a.Name] = true
	}
	for _, c := range s.Clients {
		if c.AP != "" && !aps[c.AP] {
			errs = append(errs, fmt.Errorf("client %s: unknown access point %q", c.Name, c.AP))
		}
	}
	if s.Plane != nil {
		if err := s.Plane.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("world: %w", err))
		}
		for _, n := range s.Nodes {
			if _, ok := s.Plane.Node(n.Name); !ok {
				errs = append(errs, fmt.Errorf("world: node %s has no place", n.Name))
			}
		}
		for _, a := range s.APs {
			if _, ok := s.Plane.AP(a.Name); !ok {
				errs = append(errs, fmt.Errorf("world: access point %s has no place", a.Name))
			}
		}
	}
	// core is the router's namespace; controller the controller's certificate name,
	// which a node of that name could present to the agents.
	seen := map[string]bool{"core": true, "controller": true}
	for _, e := range append(append(append([]Endpoint{}, s.Nodes...), s.Clients...), s.APs...) {
		if !nameRE.MatchString(e.Name) {
			errs = append(errs, fmt.Errorf("endpoint name %q: want 1-10 lowercase letters/digits", e.Name))
		}
		if seen[e.Name] {
			errs = append(errs, fmt.Errorf("endpoint name %q used twice (or reserved)", e.Name))
		}
		seen[e.Name] = true
		if err := e.Link.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", e.Name, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidSpec, err)
	}
	return nil
}

// Validate checks link parameters.
func (l Link) Validate() error {
	switch {
	case l.Delay < 0 || l.Delay > 10*time.Second:
		return fmt.Errorf("delay %v out of range 0..10s", l.Delay)
	case l.Jitter < 0 || l.Jitter > l.Delay:
		return fmt.Errorf("jitter %v must be between 0 and the delay %v", l.Jitter, l.Delay)
	case l.Loss < 0 || l.Loss > 1:
		return fmt.Errorf("loss %v out of range 0..1", l.Loss)
	case l.RateBps != 0 && l.RateBps < 8000:
		return fmt.Errorf("rate %d bit/s below 8 kbit/s", l.RateBps)
	}
	return nil
}

// NodeAddr is node k's underlay address (its VTEP and agent address).
func NodeAddr(k int) netip.Addr { return netip.AddrFrom4([4]byte{172, 30, byte(k), 2}) }

// NodeCoreAddr is the core's address on node k's link.
func NodeCoreAddr(k int) netip.Addr { return netip.AddrFrom4([4]byte{172, 30, byte(k), 1}) }

// ClientAddr is client k's underlay address.
func ClientAddr(k int) netip.Addr { return netip.AddrFrom4([4]byte{172, 31, byte(k), 2}) }

// ClientCoreAddr is the core's address on client k's link.
func ClientCoreAddr(k int) netip.Addr { return netip.AddrFrom4([4]byte{172, 31, byte(k), 1}) }

// APAddr is access point k's address on its link to the core.
func APAddr(k int) netip.Addr { return netip.AddrFrom4([4]byte{172, 28, byte(k), 2}) }

// APCoreAddr is the core's address on access point k's link.
func APCoreAddr(k int) netip.Addr { return netip.AddrFrom4([4]byte{172, 28, byte(k), 1}) }

// ClientPrefix is client k's access network (its AP side is .1, the
// client .2), wherever the client is attached.
func ClientPrefix(k int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{172, 31, byte(k), 0}), 24)
}

// DefaultAPLink joins an access point to the core: 1 Gbit/s, 1 ms.
var DefaultAPLink = Link{RateBps: 1_000_000_000, Delay: time.Millisecond}

// World returns the plane the controller works on: the spec's own, or
// the nodes as regions along a line 300 m apart (each node at the middle
// of its region, set back 50 m) with the APs spread over them in order.
func (s Spec) World() topo.Topology {
	if s.Plane != nil {
		return *s.Plane
	}
	var t topo.Topology
	const width = 300.0
	n := len(s.Nodes)
	for i, e := range s.Nodes {
		r := fmt.Sprintf("region%d", i)
		t.Regions = append(t.Regions, topo.Region{Name: r})
		t.Nodes = append(t.Nodes, topo.Node{Name: e.Name, Region: r, Pos: topo.Point{X: float64(i)*width + width/2, Y: 50}})
		if i > 0 {
			t.Links = append(t.Links, topo.Link{A: fmt.Sprintf("region%d", i-1), B: r, DelayMs: 2, RateMbps: 1000})
		}
	}
	if n == 0 {
		return t
	}
	per := (len(s.APs) + n - 1) / n
	for i, a := range s.APs {
		r := min(i/max(per, 1), n-1)
		slot := i - r*per
		x := float64(r)*width + width*(float64(slot)+0.5)/float64(per)
		t.APs = append(t.APs, topo.AP{Name: a.Name, Region: fmt.Sprintf("region%d", r), Pos: topo.Point{X: x}})
	}
	return t
}

// NodeRange is the overlay range node k allocates container addresses from.
func NodeRange(k int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 200, byte(k + 1), 0}), 24)
}

// AgentPort is the TCP port agents listen on for their peers.
const AgentPort = 7070

// MigratePort is the TCP port of agents' migration listeners (mTLS).
const MigratePort = 7071
