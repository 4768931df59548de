package testbed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/edgehop/edgehop/internal/controller"
	"github.com/edgehop/edgehop/internal/pki"
)

// ControllerAgentPort is where the testbed's controller hears its agents:
// on the core's address, inside the core namespace.
const ControllerAgentPort = 7080

func (st *State) controllerDir() string { return filepath.Join(st.Dir, "controller") }

// agentControllerURL is the controller's agent listener as nodes reach it.
func agentControllerURL() string {
	return "https://" + net.JoinHostPort(CoreVTEP.String(), strconv.Itoa(ControllerAgentPort))
}

// prepareController writes the controller's certificate and
// configuration and returns its process: it runs in the machine's root
// namespace, serves the operator API and dashboard on a loopback port,
// and its agents' listener inside the core namespace.
func prepareController(st *State, o Options, ca *pki.CA) (Proc, error) {
	dir := st.controllerDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Proc{}, err
	}
	tlsDir := filepath.Join(dir, "tls")
	if err := ca.Issue(tlsDir, "controller", []net.IP{CoreVTEP.AsSlice()}); err != nil {
		return Proc{}, fmt.Errorf("controller certificate: %w", err)
	}
	port, err := freeLoopbackPort()
	if err != nil {
		return Proc{}, err
	}
	agents := map[string]string{}
	for _, n := range st.Nodes {
		agents[n.Name] = n.Socket
	}
	fc := controller.FileConfig{
		Listen: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), AgentListen: net.JoinHostPort(CoreVTEP.String(), strconv.Itoa(ControllerAgentPort)),
		AgentNetNS: st.Core.NetNSPath, TLSDir: tlsDir, DB: filepath.Join(dir, "controller.db"), Topology: st.Spec.World(),
		Agents: agents, Testbed: &controller.TestbedRef{Root: filepath.Dir(filepath.Dir(st.Dir)), Name: st.Name},
		TokenFile: filepath.Join(dir, controller.TokenFileName),
	}
	if err := fc.Validate(); err != nil {
		return Proc{}, fmt.Errorf("controller config: %w", err)
	}
	b, _ := json.MarshalIndent(fc, "", "  ")
	cfgPath := filepath.Join(dir, "controller.json")
	if err := os.WriteFile(cfgPath, b, 0o644); err != nil {
		return Proc{}, err
	}
	st.Controller = ControllerRef{URL: "http://" + fc.Listen, AgentURL: agentControllerURL(), TokenFile: fc.TokenFile}
	return Proc{Name: "controller", Args: []string{o.Binary, "controller", "--config", cfgPath},
		Log: filepath.Join(dir, "controller.log"), PIDFile: filepath.Join(dir, "controller.pid")}, nil
}

// Token reads the operator API's token.
func (r ControllerRef) Token() (string, error) {
	if r.TokenFile == "" {
		return "", errors.New("the testbed records no controller token file (made before the controller had one?)")
	}
	return controller.ReadToken(r.TokenFile)
}

// Client is a client of the controller's operator API with its token.
func (r ControllerRef) Client() (*controller.Client, error) {
	tok, err := r.Token()
	if err != nil {
		return nil, err
	}
	return controller.NewClient(r.URL, tok), nil
}

// freeLoopbackPort picks a port on 127.0.0.1 nobody listens on now.
func freeLoopbackPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pick a controller port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitController waits until the controller has made its token and
// answers a request carrying it.
func waitController(ctx context.Context, st *State) error {
	hc := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(15 * time.Second)
	pidFile := filepath.Join(st.controllerDir(), "controller.pid")
	for {
		if tok, err := st.Controller.Token(); err == nil {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, st.Controller.URL+"/v1/nodes", nil)
			if err != nil {
				return err
			}
			req.Header.Set("Authorization", "Bearer "+tok)
			if resp, err := hc.Do(req); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return nil
				}
			}
		}
		if exited(pidFile) || time.Now().After(deadline) {
			log := filepath.Join(st.controllerDir(), "controller.log")
			return fmt.Errorf("controller not ready (%s ends: %q)", log, logTail(log, 400))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
