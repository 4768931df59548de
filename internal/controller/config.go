package controller

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/edgehop/edgehop/internal/api"
	"github.com/edgehop/edgehop/internal/radio"
	"github.com/edgehop/edgehop/internal/topo"
)

// FileConfig is the controller's configuration file (`edgehop controller
// --config FILE`); the testbed writes one.
type FileConfig struct {
	// Listen serves the operator API and the dashboard (plain HTTP, every
	// request authenticated with the token: bind it to loopback or put it
	// behind a TLS proxy named in Hosts).
	Listen string `json:"listen"`
	// TokenFile keeps the operator API's token (mode 0600; made at first
	// start). Empty: TokenFileName beside DB.
	TokenFile string `json:"token_file,omitempty"`
	// Hosts are further Host header values (host:port) the operator API
	// answers to, beside the listen address and localhost, 127.0.0.1 and
	// [::1] at its port: the names of a proxy in front of it.
	Hosts []string `json:"hosts,omitempty"`
	// AgentListen serves the agents' heartbeats over mutual TLS with the
	// certificate in TLSDir (named "controller"); AgentNetNS, when set,
	// is the network namespace (path) to open it in.
	AgentListen string `json:"agent_listen,omitempty"`
	AgentNetNS  string `json:"agent_netns,omitempty"`
	TLSDir      string `json:"tls_dir,omitempty"`
	// DB is the SQLite file of state and history.
	DB       string        `json:"db"`
	Topology topo.Topology `json:"topology"`
	Radio    *radio.Model  `json:"radio,omitempty"`
	// Agents maps each node to its agent's operator socket.
	Agents map[string]string `json:"agents"`
	// Testbed, when set, is where handoffs are applied: the controller
	// moves the clients' virtual APs between the AP namespaces.
	Testbed *TestbedRef `json:"testbed,omitempty"`
	// ModelParams is a file of fitted model parameters (`edgehop model
	// fit --out`); empty: PAM's.
	ModelParams        string `json:"model_params,omitempty"`
	HeartbeatTimeoutMs int    `json:"heartbeat_timeout_ms,omitempty"`
}

// TestbedRef names a testbed.
type TestbedRef struct {
	Root string `json:"root"`
	Name string `json:"name"`
}

// Validate checks the configuration.
func (c FileConfig) Validate() error {
	var errs []error
	if c.Listen == "" {
		errs = append(errs, errors.New("listen is empty"))
	}
	if c.DB == "" || (c.DB != ":memory:" && !filepath.IsAbs(c.DB)) {
		errs = append(errs, fmt.Errorf("db %q: want an absolute path", c.DB))
	}
	if c.TokenFile != "" && !filepath.IsAbs(c.TokenFile) {
		errs = append(errs, fmt.Errorf("token_file %q: want an absolute path", c.TokenFile))
	}
	if c.TokenFile == "" && c.DB == ":memory:" {
		errs = append(errs, errors.New("token_file is needed with db :memory: (no state directory)"))
	}
	for _, h := range c.Hosts {
		if _, _, err := net.SplitHostPort(h); err != nil {
			errs = append(errs, fmt.Errorf("hosts: %q: want host:port", h))
		}
	}
	if c.AgentListen != "" && c.TLSDir == "" {
		errs = append(errs, errors.New("agent_listen needs tls_dir"))
	}
	if err := c.Topology.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("topology: %w", err))
	}
	for n := range c.Agents {
		if _, ok := c.Topology.Node(n); !ok {
			errs = append(errs, fmt.Errorf("agent of %q: not a node of the topology", n))
		}
	}
	return errors.Join(errs...)
}

// TokenPath is the token file: TokenFile, or TokenFileName beside DB.
func (c FileConfig) TokenPath() string {
	if c.TokenFile != "" {
		return c.TokenFile
	}
	return filepath.Join(filepath.Dir(c.DB), TokenFileName)
}

// LoadFileConfig reads a configuration file.
func LoadFileConfig(path string) (FileConfig, error) {
	var c FileConfig
	b, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("read controller config: %w", err)
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("parse controller config %s: %w", path, err)
	}
	return c, c.Validate()
}

// SocketAgents reaches agents through their operator sockets.
type SocketAgents map[string]string

// Agent implements Agents.
func (s SocketAgents) Agent(node string) (*api.Client, error) {
	sock, ok := s[node]
	if !ok {
		return nil, fmt.Errorf("%w: no agent known for node %q", ErrNotFound, node)
	}
	return api.NewUnixClient(sock), nil
}
