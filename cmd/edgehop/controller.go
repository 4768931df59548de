package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"time"

	"github.com/edgehop/edgehop/internal/controller"
	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/model"
	"github.com/edgehop/edgehop/internal/pki"
	"github.com/edgehop/edgehop/internal/radio"
	"github.com/edgehop/edgehop/internal/store"
	"github.com/edgehop/edgehop/internal/testbed"
)

func init() {
	register(command{name: "controller", summary: "run the controller (the testbed starts one): controller --config FILE", run: runController})
}

func runController(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("controller", flag.ContinueOnError)
	cfgPath := fs.String("config", "", "controller configuration file (JSON)")
	verbose := fs.Bool("v", false, "debug logging")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *cfgPath == "" {
		return fmt.Errorf("%w: --config is required", errUsage)
	}
	debug.SetGCPercent(controller.GCPercent)
	fc, err := controller.LoadFileConfig(*cfgPath)
	if err != nil {
		return err
	}
	lvl := slog.LevelInfo
	if *verbose {
		lvl = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
	st, err := store.Open(fc.DB)
	if err != nil {
		return err
	}
	defer st.Close()
	rm := radio.DefaultModel()
	if fc.Radio != nil {
		rm = *fc.Radio
	}
	cfg := controller.Config{Topology: fc.Topology, Radio: rm, Store: st, Agents: controller.SocketAgents(fc.Agents),
		HeartbeatTimeout: time.Duration(fc.HeartbeatTimeoutMs) * time.Millisecond, Log: log}
	if fc.Testbed != nil {
		cfg.Access = testbed.Access{Root: fc.Testbed.Root, Name: fc.Testbed.Name}
	}
	c, err := controller.New(ctx, cfg)
	if err != nil {
		return err
	}
	if fc.ModelParams != "" {
		src, err := (migrationFlags{params: fc.ModelParams}).source()
		if err != nil {
			return fmt.Errorf("model parameters: %w", err)
		}
		c.Engine().SetParams(func(s model.Strategy) model.Params {
			p, err := src.get(s)
			if err != nil {
				return model.DefaultParams()
			}
			return p
		})
	}
	token, err := controller.LoadOrCreateToken(fc.TokenPath())
	if err != nil {
		return err
	}
	ol, err := net.Listen("tcp", fc.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", fc.Listen, err)
	}
	hosts := controller.LoopbackHosts(ol.Addr().String(), append(controller.LoopbackHosts(fc.Listen), fc.Hosts...)...)
	errLog := slog.NewLogLogger(log.Handler(), slog.LevelDebug)
	servers := []*http.Server{controller.NewServer(c.Handler(controller.Auth{Token: token, Hosts: hosts}), errLog)}
	listeners := []net.Listener{ol}
	if fc.AgentListen != "" {
		tlsCfg, err := pki.ServerConfig(fc.TLSDir)
		if err != nil {
			return fmt.Errorf("controller tls: %w", err)
		}
		var al net.Listener
		listen := func() (err error) { al, err = net.Listen("tcp", fc.AgentListen); return err }
		if fc.AgentNetNS != "" {
			err = linux.InNetNS(fc.AgentNetNS, listen)
		} else {
			err = listen()
		}
		if err != nil {
			return fmt.Errorf("agent listener %s: %w", fc.AgentListen, err)
		}
		servers = append(servers, controller.NewServer(c.AgentHandler(), errLog))
		listeners = append(listeners, tls.NewListener(al, tlsCfg))
	}
	errc := make(chan error, len(servers)+1)
	for i, s := range servers {
		go func() {
			if err := s.Serve(listeners[i]); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- err
			}
		}()
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { errc <- c.Run(rctx) }()
	log.Info("controller ready", "listen", fc.Listen, "agents", fc.AgentListen, "token_file", fc.TokenPath())
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	cancel()
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	for _, s := range servers {
		_ = s.Shutdown(sctx)
	}
	return err
}
