// Package linkemu emulates the links of the edgehop testbed on one machine:
// per-direction one-way delay, jitter and loss done in user space by holding
// NFQUEUE verdicts (the kernel here has no netem), and bandwidth done by a
// tbf qdisc.
//
// It owns four things:
//   - the iptables rules that send a link's packets to its two queues
//     (InstallLink, RemoveLink, RemoveAllLinks),
//   - tbf shaping of one interface's egress (Shape),
//   - the delay daemon that serves the queues (Start, Daemon) with its control
//     socket and client (SetParams, Status),
//   - measurement of a link's RTT and throughput (Measure).
//
// The scheduling decision for each packet (release time, drop) is made by a
// pure, deterministic type (pipe); the daemon only feeds it packets and the
// clock and carries out its decisions.
//
// It must not know about testbeds, nodes or containers: it deals in
// namespace paths, interface names and queue numbers. It never prints;
// the daemon logs through an injected *slog.Logger.
package linkemu
