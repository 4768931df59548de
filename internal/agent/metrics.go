package agent

import (
	"net/http"

	"github.com/edgehop/edgehop/internal/migration"
)

// agentMetrics is the agent's view of its metrics.
type agentMetrics struct{}

func newAgentMetrics() *agentMetrics { return &agentMetrics{} }

func (m *agentMetrics) migrationStarted()                               {}
func (m *agentMetrics) observe(r migration.Result, role migration.Role) {}
func (m *agentMetrics) recovered(outcome string)                        {}
func (m *agentMetrics) handler() http.Handler                           { return http.NotFoundHandler() }
