package main

// stagefs read PATH: a file as the mount shows it, with its sha256
// (fs/read_text).

import (
	"context"
	"fmt"
	"io"
	"os"
)

func runRead(ctx context.Context, args []string) error {
	cf, rest, c, err := parseClient("read", args, nil)
	if err != nil {
		return err
	}
	defer c.Close()
	if len(rest) != 1 {
		return usagef("usage: stagefs read PATH")
	}
	here, err := fromHere(ctx, c, rest[:1])
	if err != nil {
		return err
	}
	res, err := c.ReadText(ctx, here[0])
	if err != nil {
		return err
	}
	if cf.json {
		return printJSON(res)
	}
	if !res.Exists {
		return fmt.Errorf("%s does not exist in the mount", rest[0])
	}
	fmt.Fprintf(os.Stderr, "%s  %d bytes\n", res.SHA256, res.Size)
	_, err = io.WriteString(os.Stdout, res.Content)
	return err
}
