package linkemu

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"

	"github.com/edgehop/edgehop/internal/linux"
)

// The rules live in two chains of the mangle table of the core (router)
// namespace, jumped to from PREROUTING and POSTROUTING:
//
//	-A EDGEHOP-LINKS-UP   -i IF -j NFQUEUE --queue-num UP   --queue-bypass
//	-A EDGEHOP-LINKS-DOWN -o IF -j NFQUEUE --queue-num DOWN --queue-bypass
//
// UP takes what arrives from the far end of link IF (before routing), DOWN
// what leaves towards it (after routing, including packets the core itself
// sends). --queue-bypass passes packets unchanged when no daemon serves the
// queue. Every change rewrites both chains in one iptables-restore
// transaction. Calls on one namespace must not run concurrently.
//
// Only IPv4 is queued (iptables, not ip6tables): IPv6 on a link passes
// without delay or loss, though tbf shapes it.
const (
	ChainUp   = "EDGEHOP-LINKS-UP"
	ChainDown = "EDGEHOP-LINKS-DOWN"
)

// LinkQueues names the two queues of one link: by the core-side
// interface, or (Prefix set, Interface empty) by the far end's addresses,
// whichever interface they cross — a client whose access point changes
// keeps its queues.
type LinkQueues struct {
	Interface string
	Prefix    string // e.g. 172.31.0.0/24: -s in UP, -d in DOWN
	Up, Down  uint16
}

// key identifies a link's rules.
func (l LinkQueues) key() string {
	if l.Prefix != "" {
		return "prefix " + l.Prefix
	}
	return l.Interface
}

// InstallPrefix is InstallLink for the traffic from (up) and to (down) the
// addresses of prefix.
func InstallPrefix(nsPath, prefix string, up, down uint16) error {
	if _, err := netip.ParsePrefix(prefix); err != nil {
		return fmt.Errorf("install link rules: bad prefix %q: %w", prefix, err)
	}
	st, err := readRules(nsPath)
	if err != nil {
		return fmt.Errorf("install link rules %s: %w", prefix, err)
	}
	l := LinkQueues{Prefix: prefix, Up: up, Down: down}
	links := slices.DeleteFunc(st.links, func(o LinkQueues) bool { return o.key() == l.key() })
	links = append(links, l)
	if err := restore(nsPath, st.script(links)); err != nil {
		return fmt.Errorf("install link rules %s: %w", prefix, err)
	}
	return nil
}

// InstallLink sends the traffic of the core-side interface ifName to queues
// up (from the far end) and down (towards it) in the namespace at nsPath,
// replacing any earlier rules for ifName.
func InstallLink(nsPath, ifName string, up, down uint16) error {
	if ifName == "" || strings.ContainsAny(ifName, " \t\n") || len(ifName) > 15 {
		return fmt.Errorf("install link rules: bad interface name %q", ifName)
	}
	st, err := readRules(nsPath)
	if err != nil {
		return fmt.Errorf("install link rules %s: %w", ifName, err)
	}
	links := slices.DeleteFunc(st.links, func(l LinkQueues) bool { return l.Prefix == "" && l.Interface == ifName })
	links = append(links, LinkQueues{Interface: ifName, Up: up, Down: down})
	if err := restore(nsPath, st.script(links)); err != nil {
		return fmt.Errorf("install link rules %s: %w", ifName, err)
	}
	return nil
}

// RemoveLink removes the rules of ifName; absent rules are not an error.
func RemoveLink(nsPath, ifName string) error {
	st, err := readRules(nsPath)
	if err != nil {
		return fmt.Errorf("remove link rules %s: %w", ifName, err)
	}
	links := slices.DeleteFunc(slices.Clone(st.links), func(l LinkQueues) bool { return l.Prefix == "" && l.Interface == ifName })
	if len(links) == len(st.links) {
		return nil
	}
	if err := restore(nsPath, st.script(links)); err != nil {
		return fmt.Errorf("remove link rules %s: %w", ifName, err)
	}
	return nil
}

// RemoveAllLinks removes both chains and the jumps to them.
func RemoveAllLinks(nsPath string) error {
	st, err := readRules(nsPath)
	if err != nil {
		return fmt.Errorf("remove link rules: %w", err)
	}
	var b strings.Builder
	b.WriteString("*mangle\n")
	if st.jumpUp {
		fmt.Fprintf(&b, "-D PREROUTING -j %s\n", ChainUp)
	}
	if st.jumpDown {
		fmt.Fprintf(&b, "-D POSTROUTING -j %s\n", ChainDown)
	}
	for _, c := range []struct {
		name   string
		exists bool
	}{{ChainUp, st.chainUp}, {ChainDown, st.chainDown}} {
		if c.exists {
			fmt.Fprintf(&b, "-F %s\n-X %s\n", c.name, c.name)
		}
	}
	b.WriteString("COMMIT\n")
	if !st.jumpUp && !st.jumpDown && !st.chainUp && !st.chainDown {
		return nil
	}
	if err := restore(nsPath, b.String()); err != nil {
		return fmt.Errorf("remove link rules: %w", err)
	}
	return nil
}

// ListLinks returns the links whose rules are installed in nsPath, in rule
// order. A link missing one of its two rules is reported with queue 0 for
// that direction.
func ListLinks(nsPath string) ([]LinkQueues, error) {
	st, err := readRules(nsPath)
	if err != nil {
		return nil, fmt.Errorf("list link rules: %w", err)
	}
	return st.links, nil
}

// ruleState is what iptables -S shows of our chains.
type ruleState struct {
	chainUp, chainDown bool
	jumpUp, jumpDown   bool
	links              []LinkQueues
}

// script returns an iptables-restore --noflush script that makes the chains
// hold exactly links. Declaring a chain in the script flushes it.
func (st ruleState) script(links []LinkQueues) string {
	var b strings.Builder
	fmt.Fprintf(&b, "*mangle\n:%s - [0:0]\n:%s - [0:0]\n", ChainUp, ChainDown)
	if !st.jumpUp {
		fmt.Fprintf(&b, "-A PREROUTING -j %s\n", ChainUp)
	}
	if !st.jumpDown {
		fmt.Fprintf(&b, "-A POSTROUTING -j %s\n", ChainDown)
	}
	for _, l := range links {
		if l.Prefix != "" {
			fmt.Fprintf(&b, "-A %s -s %s -j NFQUEUE --queue-num %d --queue-bypass\n", ChainUp, l.Prefix, l.Up)
			fmt.Fprintf(&b, "-A %s -d %s -j NFQUEUE --queue-num %d --queue-bypass\n", ChainDown, l.Prefix, l.Down)
			continue
		}
		fmt.Fprintf(&b, "-A %s -i %s -j NFQUEUE --queue-num %d --queue-bypass\n", ChainUp, l.Interface, l.Up)
		fmt.Fprintf(&b, "-A %s -o %s -j NFQUEUE --queue-num %d --queue-bypass\n", ChainDown, l.Interface, l.Down)
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

func readRules(nsPath string) (ruleState, error) {
	out, err := iptables(nsPath, nil, "iptables", "-w", "5", "-t", "mangle", "-S")
	if err != nil {
		return ruleState{}, err
	}
	return parseRules(out)
}

// parseRules reads the output of `iptables -t mangle -S`.
func parseRules(out []byte) (ruleState, error) {
	var st ruleState
	idx := map[string]int{}
	link := func(l LinkQueues) *LinkQueues {
		i, ok := idx[l.key()]
		if !ok {
			i = len(st.links)
			idx[l.key()] = i
			st.links = append(st.links, l)
		}
		return &st.links[i]
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 2 && f[0] == "-N":
			st.chainUp = st.chainUp || f[1] == ChainUp
			st.chainDown = st.chainDown || f[1] == ChainDown
		case len(f) == 4 && f[0] == "-A" && f[1] == "PREROUTING" && f[2] == "-j" && f[3] == ChainUp:
			st.jumpUp = true
		case len(f) == 4 && f[0] == "-A" && f[1] == "POSTROUTING" && f[2] == "-j" && f[3] == ChainDown:
			st.jumpDown = true
		case len(f) >= 2 && f[0] == "-A" && (f[1] == ChainUp || f[1] == ChainDown):
			l, num, err := parseQueueRule(f[2:])
			if err != nil {
				return st, fmt.Errorf("unexpected rule %q: %w", line, err)
			}
			if f[1] == ChainUp {
				link(l).Up = num
			} else {
				link(l).Down = num
			}
		}
	}
	return st, nil
}

// parseQueueRule reads "-i IF -j NFQUEUE --queue-num N --queue-bypass"
// (or -o, or -s/-d PREFIX; iptables omits --queue-num 0).
func parseQueueRule(f []string) (l LinkQueues, num uint16, err error) {
	nfq := false
	var ifName string
	for i := 0; i < len(f); i++ {
		switch f[i] {
		case "-j":
			if i+1 < len(f) {
				nfq = f[i+1] == "NFQUEUE"
				i++
			}
		case "-i", "-o":
			if i+1 < len(f) {
				ifName = f[i+1]
				i++
			}
		case "-s", "-d":
			if i+1 < len(f) {
				l.Prefix = f[i+1]
				i++
			}
		case "--queue-num":
			if i+1 < len(f) {
				n, err := strconv.ParseUint(f[i+1], 10, 16)
				if err != nil {
					return l, 0, err
				}
				num = uint16(n)
				i++
			}
		}
	}
	if (ifName == "") == (l.Prefix == "") || !nfq {
		return l, 0, errors.New("not an interface or prefix NFQUEUE rule")
	}
	l.Interface = ifName
	return l, num, nil
}

func restore(nsPath, script string) error {
	_, err := iptables(nsPath, []byte(script), "iptables-restore", "-w", "5", "--noflush")
	return err
}

// iptables runs an iptables tool in the namespace at nsPath.
func iptables(nsPath string, stdin []byte, name string, args ...string) ([]byte, error) {
	cmd := linux.Command(nsPath, name, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return nil, fmt.Errorf("%s: %w: %s", name, err, strings.TrimSpace(stderr.String()))
		}
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return out, nil
}
