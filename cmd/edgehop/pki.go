package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/edgehop/edgehop/internal/pki"
)

func init() {
	register(command{name: "pki", summary: "certificates for agents on real hosts: pki ca DIR | pki node --ca DIR --name N [--ip A,B] --out DIR | pki operator --ca DIR --name N --out DIR", run: runPKI})
}

func runPKI(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: edgehop pki ca|node|operator …", errUsage)
	}
	switch args[0] {
	case "ca":
		if len(args) != 2 {
			return fmt.Errorf("%w: edgehop pki ca DIR", errUsage)
		}
		if _, err := pki.NewCA(args[1]); err != nil {
			return err
		}
		fmt.Printf("CA in %s (keep %s secret)\n", args[1], filepath.Join(args[1], pki.CAKeyFile))
		return nil
	case "node", "operator":
		fl := flag.NewFlagSet("pki "+args[0], flag.ContinueOnError)
		caDir := fl.String("ca", "", "the CA's directory (made by 'edgehop pki ca')")
		name := fl.String("name", "", "the node's or operator's name")
		out := fl.String("out", "", "directory for the certificate, its key and the CA certificate")
		ips := fl.String("ip", "", "node: addresses it is reached at, comma-separated")
		force := fl.Bool("force", false, "replace a certificate already in --out")
		if err := parse(fl, args[1:]); err != nil {
			return err
		}
		if *caDir == "" || *name == "" || *out == "" {
			return fmt.Errorf("%w: --ca, --name and --out are required", errUsage)
		}
		if _, err := os.Stat(filepath.Join(*caDir, pki.CAKeyFile)); err != nil {
			return fmt.Errorf("no CA in %s (%v): create one with 'edgehop pki ca %s'", *caDir, err, *caDir)
		}
		certFile := pki.NodeCertFile
		if args[0] == "operator" {
			certFile = pki.OperatorCertFile
		}
		if _, err := os.Stat(filepath.Join(*out, certFile)); err == nil && !*force {
			return fmt.Errorf("%s already holds %s: pass --force to replace it", *out, certFile)
		} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		ca, err := pki.NewCA(*caDir)
		if err != nil {
			return err
		}
		if args[0] == "operator" {
			if *ips != "" {
				return fmt.Errorf("%w: an operator certificate names no address", errUsage)
			}
			if err := ca.IssueOperator(*out, *name); err != nil {
				return err
			}
			fmt.Printf("operator %s: %s\n", *name, filepath.Join(*out, certFile))
			return nil
		}
		var addrs []net.IP
		for _, s := range strings.Split(*ips, ",") {
			if s = strings.TrimSpace(s); s == "" {
				continue
			}
			ip := net.ParseIP(s)
			if ip == nil {
				return fmt.Errorf("%w: --ip %q is not an address", errUsage, s)
			}
			addrs = append(addrs, ip)
		}
		if err := ca.Issue(*out, *name, addrs); err != nil {
			return err
		}
		fmt.Printf("node %s: %s\n", *name, filepath.Join(*out, certFile))
		return nil
	}
	return fmt.Errorf("%w: edgehop pki ca|node|operator …", errUsage)
}
