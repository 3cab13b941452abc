package main

import (
	"context"
	"errors"
)

// runChildCommand is the hidden subcommand that sets up the private mount
// namespace for stagefs run and then becomes the command.
const runChildCommand = "__run-child"

func runRun(ctx context.Context, args []string) error {
	return errors.New("stagefs run is not built yet")
}

func runChild(ctx context.Context, args []string) error {
	return errors.New("stagefs run is not built yet")
}
