package netplane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
	nfqueue "github.com/florianl/go-nfqueue/v2"
	"github.com/vishvananda/netlink"
)

// holdQueue and synQueue are the NFQUEUE numbers used inside a
// container's namespace (queue numbers are per namespace): the
// destination's Holder, and the source's hold of new connections.
const (
	holdQueue   = 0
	synQueue    = 1
	loopQueue   = 2
	frozenQueue = 3
)

// Holder keeps every packet that arrives for a migrating service in the
// kernel, unverdicted, until the service is restored, then lets them all
// through at once: the client's retransmissions are answered the moment
// the service is back instead of after its next, backed-off retransmission
// timeout (CRIU's lock chain would drop them). It only sees what reaches
// the namespace: the node's bridge must forward the service's MAC to its
// veth throughout, which takes a sticky entry (Plane.PinLocal). Safe for
// concurrent use.
type Holder struct {
	ns     string
	rules  []string
	keep   bool // keep each held packet's bytes and the sender's MAC (HoldNew)
	nf     *nfqueue.Nfqueue
	cancel context.CancelFunc

	// exempt: sources whose packets pass until Arm (HoldNew).
	exempt []netip.Addr
	// pass: every packet passes until Arm (HoldFrozen).
	pass bool
	// dropOut: once armed, what the namespace sends is dropped, not held.
	dropOut bool

	mu       sync.Mutex // guards ids, kept, armed, done and dropping
	ids      []uint32   // held packets in arrival order
	kept     []Packet   // with keep: their contents
	armed    bool
	done     bool
	dropping bool // after Drop: late packets are dropped, not let through
}

// Packet is a held IPv4 packet and the MAC of the host that sent it.
type Packet struct {
	From net.HardwareAddr
	IP   []byte
}

// Hold starts holding packets that enter the namespace at nsPath on eth0,
// and those the namespace sends out of it. The rules sit in mangle
// PREROUTING and OUTPUT, before CRIU's lock chain in filter INPUT, so held
// packets meet the chain only if released while it is still there.
func Hold(nsPath string) (*Holder, error) {
	return hold(&Holder{ns: nsPath, rules: holdRules}, holdQueue)
}

// HoldPod is Hold for a pod's namespace, which holds what its members
// send each other on loopback too: a member restored before another must
// not reach the other's sockets before they exist (a reset), nor be
// answered by a member whose own connections are still held.
func HoldPod(nsPath string) (*Holder, error) {
	return hold(&Holder{ns: nsPath, rules: append(slices.Clone(holdRules), podRule)}, holdQueue)
}

// HoldLoopback holds what a pod's members send each other on loopback,
// and only that: the source of a migrating pod, from the freeze of its
// first member on, while the others still run or are being dumped.
func HoldLoopback(nsPath string) (*Holder, error) {
	return hold(&Holder{ns: nsPath, rules: loopRules}, loopQueue)
}

// HoldNew starts holding the connection requests (TCP SYNs) that enter
// the namespace at nsPath, and only those: a migrating service's source
// takes no new connection it could not dump (CRIU refuses a listening
// socket with connections waiting in its accept queue, and one still
// in its handshake would be lost). Close lets them in (the service stays
// here); once the service lives elsewhere, Kept gives them to forward
// there (Plane.SendOverlay) and Drop discards the originals.
//
// Requests from the addresses in exempt (the other members of a group
// moving with the service, which freeze after it or before it in their
// own order) are let in at once, until Arm.
func HoldNew(nsPath string, exempt ...netip.Addr) (*Holder, error) {
	return hold(&Holder{ns: nsPath, rules: synRules, keep: true, exempt: exempt}, synQueue)
}

// HoldFrozen prepares the source's hold of a frozen service's traffic in
// the namespace at nsPath, in place of taking its link down. Until Arm,
// every packet passes (through the queue: its rules are in place before
// the freeze, so that arming costs no iptables run in the frozen window).
// Armed, it holds every packet entering on eth0 but the connection
// requests HoldNew's rule takes first, and keeps its contents: no packet
// reaches the frozen sockets, so the dump takes their state as of the
// freeze, and none meets the dumped tasks' absence and draws a reset. Once
// the service lives elsewhere, Kept gives them to forward there, where
// they are held until its restore (a client's data is answered then, not
// after its next, backed-off retransmission); if it stays, Close lets them
// in. What the namespace sends out of eth0 is dropped once armed (the
// frozen sockets' timers; TCP sends it again).
func HoldFrozen(nsPath string) (*Holder, error) {
	return hold(&Holder{ns: nsPath, rules: frozenRules, keep: true, pass: true, dropOut: true}, frozenQueue)
}

// Arm starts holding what a HoldFrozen's holder let pass, and the
// packets from a HoldNew's exempt sources.
func (h *Holder) Arm() {
	h.mu.Lock()
	h.armed = true
	h.mu.Unlock()
}

func hold(h *Holder, queue uint16) (*Holder, error) {
	ns, err := linux.OpenNetNS(h.ns)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	nsPath, keep := h.ns, h.keep
	copyMode, flags := uint8(nfqueue.NfQnlCopyMeta), uint32(nfqueue.NfQaCfgFlagGSO)
	if keep {
		// Whole packets, with their checksums completed by the kernel
		// (with the GSO flag, a packet from a veth comes with its TCP
		// checksum left to offload, and forwarded so it is dropped).
		copyMode, flags = nfqueue.NfQnlCopyPacket, 0
	}
	cfg := &nfqueue.Config{
		NfQueue:      queue,
		MaxQueueLen:  65536,
		Copymode:     copyMode,
		MaxPacketLen: 0xffff,
		Flags:        flags,
		AfFamily:     syscall.AF_INET,
		NetNS:        int(ns),
	}
	if h.nf, err = nfqueue.Open(cfg); err != nil {
		return nil, fmt.Errorf("hold: open nfqueue: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	err = h.nf.RegisterWithErrorFunc(ctx, func(a nfqueue.Attribute) int {
		if a.PacketID == nil {
			return 0
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		switch {
		case h.dropping:
			_ = h.nf.SetVerdict(*a.PacketID, nfqueue.NfDrop)
			return 0
		case h.done:
			_ = h.nf.SetVerdict(*a.PacketID, nfqueue.NfAccept)
			return 0
		case h.armed && h.dropOut && outgoing(a):
			_ = h.nf.SetVerdict(*a.PacketID, nfqueue.NfDrop)
			return 0
		case !h.armed && (h.pass || len(h.exempt) > 0 && a.Payload != nil && slices.Contains(h.exempt, ipv4Source(*a.Payload))):
			_ = h.nf.SetVerdict(*a.PacketID, nfqueue.NfAccept)
			return 0
		}
		h.ids = append(h.ids, *a.PacketID)
		if h.keep && !outgoing(a) && a.Payload != nil && a.HwAddr != nil && len(*a.HwAddr) == 6 {
			h.kept = append(h.kept, Packet{From: append(net.HardwareAddr(nil), *a.HwAddr...), IP: append([]byte(nil), *a.Payload...)})
		}
		return 0
	}, func(err error) int {
		if ctx.Err() != nil {
			return 1
		}
		return 0
	})
	if err != nil {
		cancel()
		return nil, errors.Join(fmt.Errorf("hold: register: %w", err), h.nf.Close())
	}
	if err := holdRule(nsPath, "-A", h.rules); err != nil {
		cancel()
		return nil, errors.Join(err, h.nf.Close())
	}
	return h, nil
}

// holdRules are the Holder's rules: every packet entering the service's
// namespace on eth0, and every packet it sends out of it. Without
// --queue-bypass: when nobody listens on the queue (the agent died) the
// kernel drops them, which TCP survives; a reset or a duplicate answer it
// would not.
var holdRules = []string{
	"PREROUTING -i eth0 -j NFQUEUE --queue-num " + fmt.Sprint(holdQueue),
	"OUTPUT -o eth0 -j NFQUEUE --queue-num " + fmt.Sprint(holdQueue),
}

// podRule is HoldPod's rule beyond Hold's: every packet a pod's member
// sends another (loopback packets leave through OUTPUT, where they are
// held, then enter through PREROUTING, where no rule holds them again).
var podRule = "OUTPUT -o lo -j NFQUEUE --queue-num " + fmt.Sprint(holdQueue)

// loopRules are HoldLoopback's.
var loopRules = []string{"OUTPUT -o lo -j NFQUEUE --queue-num " + fmt.Sprint(loopQueue)}

// synRules are HoldNew's: connection requests entering on eth0.
var synRules = []string{
	"PREROUTING -i eth0 -p tcp --syn -j NFQUEUE --queue-num " + fmt.Sprint(synQueue),
}

// frozenRules are HoldFrozen's: every packet entering on eth0 (after
// synRules: a connection request HoldNew holds or lets in does not reach
// them) and every packet the namespace sends out of it.
var frozenRules = []string{
	"PREROUTING -i eth0 -j NFQUEUE --queue-num " + fmt.Sprint(frozenQueue),
	"OUTPUT -o eth0 -j NFQUEUE --queue-num " + fmt.Sprint(frozenQueue),
}

// outgoing says whether a queued packet is one the namespace sends.
func outgoing(a nfqueue.Attribute) bool {
	return a.OutDev != nil && *a.OutDev != 0 && (a.InDev == nil || *a.InDev == 0)
}

// ipv4Source is an IPv4 packet's source address (the zero Addr for
// anything else).
func ipv4Source(p []byte) netip.Addr {
	if len(p) < 20 || p[0]>>4 != 4 {
		return netip.Addr{}
	}
	return netip.AddrFrom4([4]byte(p[12:16]))
}

func holdRule(nsPath, op string, rules []string) error {
	lines := make([]string, len(rules))
	for i, r := range rules {
		lines[i] = op + " " + r
	}
	if err := iptablesRestore(nsPath, "mangle", lines); err != nil {
		return fmt.Errorf("hold rules %s: %w", op, err)
	}
	return nil
}

// iptablesRestore applies lines to table in the namespace at nsPath in one
// `iptables-restore --noflush` transaction.
func iptablesRestore(nsPath, table string, lines []string) error {
	var b strings.Builder
	b.WriteString("*" + table + "\n")
	for _, l := range lines {
		b.WriteString(l + "\n")
	}
	b.WriteString("COMMIT\n")
	cmd := linux.Command(nsPath, "iptables-restore", "-w", "--noflush")
	cmd.Stdin = strings.NewReader(b.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%v: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

// Unhold removes the hold rules a Holder (any of them) left in
// the namespace at nsPath when its agent died; rules that are not there
// are not an error.
func Unhold(nsPath string) error {
	var errs []error
	for _, r := range slices.Concat(holdRules, []string{podRule}, synRules, loopRules, frozenRules) {
		if !rulePresent(nsPath, r) {
			continue
		}
		if out, err := linux.Command(nsPath, "iptables", ruleArgs("-D", r)...).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("remove hold rule %q: %v: %s", r, err, bytes.TrimSpace(out)))
		}
	}
	return errors.Join(errs...)
}

// Holding reports whether hold rules are present in the namespace.
func Holding(nsPath string) bool { return rulePresent(nsPath, holdRules[0]) }

// rulePresent reports whether a hold rule ("CHAIN spec…") is in the
// namespace's mangle table.
func rulePresent(nsPath, rule string) bool {
	return linux.Command(nsPath, "iptables", ruleArgs("-C", rule)...).Run() == nil
}

// ruleArgs are iptables' arguments applying op (-C, -D) to a hold rule.
func ruleArgs(op, rule string) []string {
	chain, spec, _ := strings.Cut(rule, " ")
	return append([]string{"-w", "-t", "mangle", op, chain}, strings.Fields(spec)...)
}

// Held is the number of packets held so far.
func (h *Holder) Held() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.ids)
}

// Release lets every held packet through, in arrival order; packets that
// arrive later pass at once. It returns how many were held. The rule and
// the queue stay until Close, which can wait until the restored service
// has been reported (removing the rule runs iptables: ~10-40 ms).
func (h *Holder) Release() (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.done = true
	ids := h.ids
	h.ids = nil
	var errs []error
	for _, id := range ids {
		if err := h.nf.SetVerdict(id, nfqueue.NfAccept); err != nil {
			errs = append(errs, err)
		}
	}
	return len(ids), errors.Join(errs...)
}

// Close releases whatever is still held, removes the rule and closes the
// queue.
func (h *Holder) Close() error {
	_, err := h.Release()
	errs := []error{err, holdRule(h.ns, "-D", h.rules)}
	h.cancel()
	errs = append(errs, h.nf.Close())
	return errors.Join(errs...)
}

// Kept returns the held packets' contents (HoldNew's holders keep them).
func (h *Holder) Kept() []Packet {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Packet(nil), h.kept...)
}

// Drop discards the held packets and stops; a packet that arrives before
// its rule is gone is dropped too.
func (h *Holder) Drop() error {
	h.mu.Lock()
	h.done, h.dropping = true, true
	for _, id := range h.ids {
		_ = h.nf.SetVerdict(id, nfqueue.NfDrop)
	}
	h.ids = nil
	h.mu.Unlock()
	err := holdRule(h.ns, "-D", h.rules)
	h.cancel()
	return errors.Join(err, h.nf.Close())
}

// Pending counts the connections in the namespace at nsPath that a
// checkpoint could not take: those still in their handshake (SYN_RECV)
// and those waiting in a listening socket's accept queue.
func Pending(nsPath string) (handshaking, queued int, err error) {
	h, err := diagHandle(nsPath)
	if err != nil {
		return 0, 0, err
	}
	defer h.Close()
	return pending(h, nsPath)
}

// WaitSettled polls Pending, through one netlink socket, until nothing
// is pending (counting the connections in their handshake only with
// handshakes), or the count has not gone below its lowest for stall (the
// service is not accepting), or max has passed; it returns the last
// counts. A loaded service draining a long accept queue keeps it waiting
// as long as the queue shrinks. It polls every millisecond, and every
// 10 ms once stall has passed.
func WaitSettled(nsPath string, stall, max time.Duration, handshakes bool) (handshaking, queued int, err error) {
	h, err := diagHandle(nsPath)
	if err != nil {
		return 0, 0, err
	}
	defer h.Close()
	start := time.Now()
	deadline := start.Add(max)
	lowest, progress := -1, start
	for {
		handshaking, queued, err = pending(h, nsPath)
		left := queued
		if handshakes {
			left += handshaking
		}
		now := time.Now()
		if lowest < 0 || left < lowest {
			lowest, progress = left, now
		}
		if err != nil || left == 0 || !now.Before(deadline) || now.Sub(progress) >= stall {
			return handshaking, queued, err
		}
		if now.Sub(start) < stall {
			time.Sleep(time.Millisecond)
		} else {
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// diagHandle is a netlink handle in the namespace at nsPath that owns an
// INET_DIAG socket of its own: for a family it was not made with, a
// handle asks in the caller's namespace.
func diagHandle(nsPath string) (*netlink.Handle, error) {
	ns, err := linux.OpenNetNS(nsPath)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns, syscall.NETLINK_INET_DIAG)
	if err != nil {
		return nil, fmt.Errorf("netlink in %s: %w", nsPath, err)
	}
	return h, nil
}

func pending(h *netlink.Handle, nsPath string) (handshaking, queued int, err error) {
	for _, family := range []uint8{syscall.AF_INET, syscall.AF_INET6} {
		socks, err := h.SocketDiagTCP(family)
		if err != nil {
			return 0, 0, fmt.Errorf("sock_diag in %s: %w", nsPath, err)
		}
		for _, s := range socks {
			switch s.State {
			case tcpSynRecv:
				handshaking++
			case tcpListen:
				queued += int(s.RQueue)
			}
		}
	}
	return handshaking, queued, nil
}

// TCP states as sock_diag reports them (a request socket is SYN_RECV).
const (
	tcpSynRecv = 3
	tcpListen  = 10
)
