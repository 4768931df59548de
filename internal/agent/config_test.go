package agent

import (
	"github.com/edgehop/edgehop/internal/transfer"
	"net/netip"
	"strings"
	"testing"
)

func validConfig() Config {
	return Config{Node: "node0", Role: RoleNode, StateDir: "/var/lib/edgehop/x", Socket: "/tmp/a.sock",
		VTEP: netip.MustParseAddr("172.30.0.2"), VNI: DefaultVNI, Overlay: netip.MustParsePrefix("10.200.0.0/16"),
		Gateway: netip.MustParseAddr("10.200.0.1"), Range: netip.MustParsePrefix("10.200.1.0/24")}
}

func TestConfigValidate(t *testing.T) {
	if err := validConfig().Validate(); err != nil {
		t.Fatalf("valid config rejected: %v", err)
	}
	for name, tc := range map[string]struct {
		mutate func(*Config)
		want   string
	}{
		"role":     {func(c *Config) { c.Role = "boss" }, "role"},
		"relative": {func(c *Config) { c.StateDir = "state" }, "absolute"},
		"gateway":  {func(c *Config) { c.Gateway = netip.MustParseAddr("192.0.2.1") }, "gateway"},
		"range":    {func(c *Config) { c.Range = netip.MustParsePrefix("10.9.0.0/24") }, "range"},
		"vni":      {func(c *Config) { c.VNI = 1 << 24 }, "vni"},
		"vtep":     {func(c *Config) { c.VTEP = netip.Addr{} }, "vtep"},
		"criu log": {func(c *Config) { c.CRIULogLevel = 5 }, "criu_log_level"},
	} {
		c := validConfig()
		tc.mutate(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Validate() = %v, want an error about %q", name, err, tc.want)
		}
	}
	// A gateway needs no range.
	g := validConfig()
	g.Role, g.Range = RoleGateway, netip.Prefix{}
	if err := g.Validate(); err != nil {
		t.Errorf("gateway config rejected: %v", err)
	}
}

func TestPageServerTokens(t *testing.T) {
	var p pageServers
	tok := p.add("127.0.0.1:4000", "node1")
	if err := p.check(transferRequest("127.0.0.1:4000", tok), "node1"); err != nil {
		t.Fatalf("own token refused: %v", err)
	}
	for _, r := range [][3]string{{"127.0.0.1:4001", tok, "node1"}, {"127.0.0.1:4000", "forged", "node1"}, {"127.0.0.1:4000", tok, "node2"}} {
		if err := p.check(transferRequest(r[0], r[1]), r[2]); err == nil {
			t.Errorf("tunnel to %s with token %q from %s allowed", r[0], r[1], r[2])
		}
	}
	p.remove(tok)
	if err := p.check(transferRequest("127.0.0.1:4000", tok), "node1"); err == nil {
		t.Error("removed token still allowed")
	}
}

func transferRequest(target, token string) transfer.TunnelRequest {
	return transfer.TunnelRequest{Target: target, Token: token}
}
