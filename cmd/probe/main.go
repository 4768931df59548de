// Command probe is edgehop's continuity probe server, the program of the
// built-in "probe" image: it listens on the TCP port given as its only
// argument (default 7000) on all addresses and answers every request line
// with the byte count and CRC-32 of everything received on that connection
// (see internal/probe). It is built static (CGO_ENABLED=0) and is safe to
// checkpoint and restore with CRIU --tcp-established: it keeps no timers
// and writes nothing after its startup line.
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"

	"github.com/edgehop/edgehop/internal/probe"
)

func main() {
	port := "7000"
	if len(os.Args) > 2 {
		fmt.Fprintln(os.Stderr, "usage: probe [PORT]")
		os.Exit(2)
	}
	if len(os.Args) == 2 {
		port = os.Args[1]
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil {
		fmt.Fprintf(os.Stderr, "probe: bad port %q\n", port)
		os.Exit(2)
	} else {
		port = strconv.FormatUint(p, 10)
	}
	// probe.Listen: plain TCP, not Go's default MPTCP, which CRIU cannot
	// checkpoint.
	ln, err := probe.Listen(context.Background(), ":"+port)
	if err != nil {
		fmt.Fprintf(os.Stderr, "probe: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("probe listening on %s\n", ln.Addr())
	if err := probe.Serve(context.Background(), ln); err != nil {
		fmt.Fprintf(os.Stderr, "probe: %v\n", err)
		os.Exit(1)
	}
}
