package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"time"
)

// Roles an agent can have.
const (
	RoleNode    = "node"    // runs containers
	RoleGateway = "gateway" // the access point: overlay gateway for clients, no containers
)

// Peer is another agent of the same overlay.
type Peer struct {
	Name    string     `json:"name"`
	API     string     `json:"api"`     // host:port of its peer API
	Migrate string     `json:"migrate"` // host:port of its migration listener (mTLS)
	VTEP    netip.Addr `json:"vtep"`    // its VXLAN endpoint address
}

// Config is everything an agent needs; the testbed (or an operator) writes
// it as JSON and `edgehop agent --config FILE` reads it.
type Config struct {
	Node     string `json:"node"`
	Role     string `json:"role"`
	StateDir string `json:"state_dir"` // this node's own directory; nothing else is shared
	Socket   string `json:"socket"`    // local API (CLI)
	Listen   string `json:"listen"`    // peer API, on the underlay
	Migrate  string `json:"migrate"`   // migration listener (mTLS), on the underlay
	// OperatorListen, when set, also serves the operator API there, to
	// clients with an operator certificate of the CA only (agents on real
	// hosts; the testbed uses the unix socket).
	OperatorListen string       `json:"operator_listen,omitempty"`
	VTEP           netip.Addr   `json:"vtep"`    // local VXLAN endpoint
	VNI            int          `json:"vni"`     // VXLAN network identifier
	Overlay        netip.Prefix `json:"overlay"` // the service network
	Gateway        netip.Addr   `json:"gateway"` // containers' default gateway
	Range          netip.Prefix `json:"range"`   // where this node allocates container IPs
	Peers          []Peer       `json:"peers"`
	ImageRoot      string       `json:"image_root"` // local OCI image cache
	TLSDir         string       `json:"tls_dir,omitempty"`
	ScratchMB      int          `json:"scratch_mb,omitempty"` // tmpfs for checkpoint images; 0 = tmpfs default
	// Controller is the base URL (https://host:port) of the controller's
	// agent listener: the agent sends it heartbeats and RTT measurements
	// over mutual TLS. Empty: no controller.
	Controller string `json:"controller,omitempty"`
	// Seccomp filters every container's system calls with the container
	// engines' default profile (moby's). Default true; false runs
	// containers unconfined.
	Seccomp *bool `json:"seccomp,omitempty"`
	// VTEPGuard lets VXLAN into the agent's network namespace only from
	// its peers' VTEPs (netplane.GuardVTEP). Default true; false leaves
	// the underlay's filtering to the operator.
	VTEPGuard *bool `json:"vtep_guard,omitempty"`
	// CRIUShim is edgehop's criu shim (runc.Runtime.Shim): "" finds
	// edgehop-criu next to the agent's executable, "off" runs CRIU
	// directly.
	CRIUShim string `json:"criu_shim,omitempty"`
	// CRIULogLevel is the level CRIU logs its dumps and restores at
	// (runc.Runtime.CRIULogLevel): 0 (the default) is 2, errors and
	// warnings; 4 is every step, as runc asks for, for diagnosis (a few
	// ms of the frozen window for a small service, tens for a large one).
	CRIULogLevel int `json:"criu_log_level,omitempty"`
	// MaxMigrations is how many migrations the node takes part in at
	// once, incoming and outgoing together (a group's members count as
	// one); 0 is DefaultMaxMigrations. Outgoing ones beyond it wait,
	// their jobs "queued"; incoming ones are refused for now and their
	// sources wait and ask again.
	MaxMigrations int `json:"max_migrations,omitempty"`
	// SourceSilenceMs bounds, in milliseconds, how long a prepared
	// destination waits for its source's next message before the freeze
	// (the live rounds' gaps, the source's holds and group barriers):
	// past it, a source that vanished without a word (its agent stopped,
	// its TCP connection still open) is given up, the copy and the claim
	// on the name dropped. 0 is DefaultSourceSilence.
	SourceSilenceMs int `json:"source_silence_ms,omitempty"`

	Log *slog.Logger `json:"-"`
}

// DefaultVNI is the overlay's VXLAN id.
const DefaultVNI = 4200

// DefaultSourceSilence is Config.SourceSilenceMs's default: well above the
// gaps of a real migration before its freeze (a round's page scan, the
// 30 s drain of accept queues, a group's members waiting for each other).
const DefaultSourceSilence = 5 * time.Minute

// sourceSilence is the configured Config.SourceSilenceMs.
func (c Config) sourceSilence() time.Duration {
	if c.SourceSilenceMs > 0 {
		return time.Duration(c.SourceSilenceMs) * time.Millisecond
	}
	return DefaultSourceSilence
}

// Validate reports every problem with the configuration at once.
func (c Config) Validate() error {
	var errs []error
	if c.Node == "" {
		errs = append(errs, errors.New("node name is empty"))
	}
	if c.Role != RoleNode && c.Role != RoleGateway {
		errs = append(errs, fmt.Errorf("role %q: want %q or %q", c.Role, RoleNode, RoleGateway))
	}
	if !filepath.IsAbs(c.StateDir) {
		errs = append(errs, fmt.Errorf("state_dir %q must be absolute", c.StateDir))
	}
	if c.Socket == "" {
		errs = append(errs, errors.New("socket is empty"))
	}
	if !c.VTEP.IsValid() {
		errs = append(errs, errors.New("vtep address missing"))
	}
	if !c.Overlay.IsValid() || !c.Overlay.Contains(c.Gateway) {
		errs = append(errs, fmt.Errorf("gateway %v not inside overlay %v", c.Gateway, c.Overlay))
	}
	if c.Role == RoleNode && (!c.Range.IsValid() || !c.Overlay.Contains(c.Range.Addr())) {
		errs = append(errs, fmt.Errorf("range %v not inside overlay %v", c.Range, c.Overlay))
	}
	if c.CRIULogLevel < 0 || c.CRIULogLevel > 4 {
		errs = append(errs, fmt.Errorf("criu_log_level %d: want 1 (errors) to 4 (every step), or 0 for the default (2)", c.CRIULogLevel))
	}
	if c.MaxMigrations < 0 {
		errs = append(errs, fmt.Errorf("max_migrations %d: want at least 1, or 0 for the default (%d)", c.MaxMigrations, DefaultMaxMigrations))
	}
	if c.SourceSilenceMs < 0 {
		errs = append(errs, fmt.Errorf("source_silence_ms %d: want a positive bound, or 0 for the default (%s)", c.SourceSilenceMs, DefaultSourceSilence))
	}
	if c.VNI <= 0 || c.VNI >= 1<<24 {
		errs = append(errs, fmt.Errorf("vni %d out of range", c.VNI))
	}
	for _, p := range c.Peers {
		if !p.VTEP.IsValid() {
			errs = append(errs, fmt.Errorf("peer %q: vtep address missing", p.Name))
		}
	}
	return errors.Join(errs...)
}

// LoadConfig reads a JSON config file.
func LoadConfig(path string) (Config, error) {
	var c Config
	b, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("read agent config: %w", err)
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("parse agent config %s: %w", path, err)
	}
	return c, nil
}
