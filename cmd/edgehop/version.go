package main

import (
	"context"
	"fmt"
)

var version = "dev"

func init() {
	register(command{name: "version", summary: "print the edgehop version", run: func(context.Context, []string) error {
		fmt.Println("edgehop", version)
		return nil
	}})
}
