package testbed

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"time"
)

// Link describes one emulated link between a node or client and the core.
type Link struct {
	RateBps uint64        `json:"rate_bps"`  // 0 = unshaped
	Delay   time.Duration `json:"delay_ns"`  // one way, each direction
	Jitter  time.Duration `json:"jitter_ns"` // uniform ±, never reorders
	Loss    float64       `json:"loss"`      // probability 0..1, each direction
}

// Endpoint is a node or a client with its link to the core.
type Endpoint struct {
	Name string `json:"name"`
	Link Link   `json:"link"`
}

// Spec is the serialisable description of a testbed.
type Spec struct {
	Name    string     `json:"name"`
	Nodes   []Endpoint `json:"nodes"`
	Clients []Endpoint `json:"clients"`
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

// MaxNodes and MaxClients bound the address plan.
const (
	MaxNodes   = 200
	MaxClients = 200
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

// ErrInvalidSpec is wrapped by every Validate failure.
var ErrInvalidSpec = errors.New("invalid testbed spec")

// Validate checks the spec: names, sizes and link parameters.
func (s Spec) Validate() error {
	var errs []error
	if !nameRE.MatchString(s.Name) {
		errs = append(errs, fmt.Errorf("testbed name %q: want 1-10 lowercase letters/digits starting with a letter", s.Name))
	}
	if len(s.Nodes) == 0 || len(s.Nodes) > MaxNodes {
		errs = append(errs, fmt.Errorf("nodes: want 1..%d, got %d", MaxNodes, len(s.Nodes)))
	}
	if len(s.Clients) > MaxClients {
		errs = append(errs, fmt.Errorf("clients: want 0..%d, got %d", MaxClients, len(s.Clients)))
	}
	seen := map[string]bool{"core": true}
	for _, e := range append(append([]Endpoint{}, s.Nodes...), s.Clients...) {
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

// NodeRange is the overlay range node k allocates container addresses from.
func NodeRange(k int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 200, byte(k + 1), 0}), 24)
}

// AgentPort is the TCP port agents listen on for their peers.
const AgentPort = 7070

// MigratePort is the TCP port of agents' migration listeners (mTLS).
const MigratePort = 7071
