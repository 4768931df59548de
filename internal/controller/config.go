package controller

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/edgehop/edgehop/internal/api"
	"github.com/edgehop/edgehop/internal/radio"
	"github.com/edgehop/edgehop/internal/topo"
)

// FileConfig is the controller's configuration file (`edgehop controller
// --config FILE`); the testbed writes one.
type FileConfig struct {
	// Listen serves the operator API and the dashboard (plain HTTP: bind
	// it to loopback or put it behind a proxy).
	Listen string `json:"listen"`
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
