package main

// stagefs patch PATH --expect HASH: a compare-and-swap write
// (fs/safe_text_patch).

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/pflag"

	"stagefs/control"
)

func runPatch(ctx context.Context, args []string) error {
	var expect, contentFile string
	var edits []string
	cf, rest, c, err := parseClient("patch", args, func(fs *pflag.FlagSet) {
		fs.StringVar(&expect, "expect", "", "sha256 of the current content, as stagefs read prints it; \"none\": the file must not exist (required)")
		fs.StringVar(&contentFile, "content-file", "", "new content from this file (default: stdin)")
		fs.StringArrayVar(&edits, "edit", nil, "OLD=NEW replacement; OLD must occur exactly once (repeatable)")
	})
	if err != nil {
		return err
	}
	defer c.Close()
	if len(rest) != 1 || (contentFile != "" && len(edits) > 0) || expect == "" {
		return usagef("usage: stagefs patch PATH --expect HASH|none [--content-file FILE | --edit OLD=NEW...] (new content on stdin by default)")
	}
	if expect == "none" {
		expect = ""
	}
	if contentFile == "" && len(edits) == 0 {
		contentFile = "-"
	}
	p := control.SafeTextPatchParams{Path: rest[0], ExpectedHash: expect}
	if contentFile != "" {
		var data []byte
		if contentFile == "-" {
			data, err = io.ReadAll(os.Stdin)
		} else {
			data, err = os.ReadFile(contentFile)
		}
		if err != nil {
			return err
		}
		s := string(data)
		p.Content = &s
	}
	for _, e := range edits {
		old, nw, ok := strings.Cut(e, "=")
		if !ok {
			return usagef("--edit wants OLD=NEW, got %q", e)
		}
		p.Edits = append(p.Edits, control.TextEdit{OldText: old, NewText: nw})
	}
	here, err := fromHere(ctx, c, []string{p.Path})
	if err != nil {
		return err
	}
	p.Path = here[0]
	res, err := c.SafeTextPatch(ctx, p)
	if err != nil {
		return err
	}
	if cf.json {
		if err := printJSON(res); err != nil {
			return err
		}
	} else {
		fmt.Printf("%s %s sha256 %s\n", res.Result, rest[0], res.SHA256)
	}
	if res.Result == control.PatchStaleBase {
		return &conflictError{"the file changed since the expected hash was taken (stale_base)"}
	}
	return nil
}
