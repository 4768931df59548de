package main

import (
	"fmt"
	"os"

	"github.com/edgehop/edgehop/internal/bench"
)

// warmMachine touches, once, the memory a benchmark with services of up
// to stateBytes will need (bench.WarmMemory says why), and says so on
// stderr.
func warmMachine(stateBytes int64) error {
	n := bench.WarmBytes(stateBytes)
	d, err := bench.WarmMemory(n)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "bench: touched %.1f GiB of memory once in %.1f s (first touch is slow on this kind of VM; every path then starts alike)\n",
		float64(n)/(1<<30), d.Seconds())
	return nil
}
