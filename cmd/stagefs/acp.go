package main

// stagefs acp -- AGENT_CMD: an ACP agent on stdin/stdout that runs
// AGENT_CMD in the staged view and relays between it and the editor
// (package acp).

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"stagefs/acp"
	"stagefs/sandbox"
)

// agentGrace is how long the agent has to exit after its input ends, and
// then after SIGTERM.
const agentGrace = 2 * time.Second

func runACP(ctx context.Context, args []string) error {
	const usage = "usage: stagefs acp [-m MOUNTPOINT | mount flags] [--workspace DIR] -- AGENT_CMD [ARGS...]"
	var cfg mountConfig
	fs := mountFlags("acp", &cfg)
	var mnt, workspace, branchName string
	fs.StringVarP(&mnt, "mount", "m", "", "join the stagefs mount at MOUNTPOINT")
	fs.StringVar(&branchName, "branch", "", "run the agent in this branch of the mount (stagefs branches lists them)")
	fs.StringVar(&workspace, "workspace", "", "the workspace (default: the current directory's)")
	if err := fs.Parse(args); err != nil {
		return usagef("acp: %v\n%s", err, usage)
	}
	argv := fs.Args()
	if len(argv) == 0 || fs.ArgsLenAtDash() != 0 {
		return usagef(usage)
	}
	// Standard output is the editor's channel: everything else goes to
	// standard error, which editors keep as the agent's log.
	logger := log.New(os.Stderr, "stagefs acp: ", 0)
	if _, err := exec.LookPath(argv[0]); err != nil {
		return fmt.Errorf("acp: the agent %s: %v", argv[0], err)
	}
	c, init, err := joinOrMount(ctx, "acp", &cfg, fs.Changed, mnt, workspace)
	if err == nil {
		c, init, err = intoBranch(ctx, c, init, branchName)
	}
	if err != nil {
		return err
	}
	defer c.Close()
	m, ok := isMounted(init.Mount)
	if !ok || !strings.HasPrefix(m.source, stagefsSourcePrefix) {
		return fmt.Errorf("the daemon's mount point %s is not a stagefs mount in this mount namespace", init.Mount)
	}
	dir, err := runWorkdir("", init.Workspace, init.Mount)
	if err != nil {
		return err
	}

	toAgentR, toAgentW, err := os.Pipe()
	if err != nil {
		return err
	}
	fromAgentR, fromAgentW, err := os.Pipe()
	if err != nil {
		return err
	}
	type ended struct {
		res sandbox.Result
		err error
	}
	exited := make(chan ended, 1)
	stop := make(chan os.Signal, 2)
	go func() {
		res, err := sandbox.Run(sandbox.Spec{
			Workspace: init.Workspace,
			Mount:     init.Mount,
			State:     strings.TrimPrefix(m.source, stagefsSourcePrefix),
			Workdir:   dir,
			Argv:      argv,
			Stdin:     toAgentR,
			Stdout:    fromAgentW,
			// The editor stops the proxy; the agent goes with it.
			Forward: func(os.Signal) bool { return true },
			Signals: stop,
		})
		// Only now does the relay see the end of the agent's output: this
		// process held the pipe's write end for the agent.
		toAgentR.Close()
		fromAgentW.Close()
		exited <- ended{res, err}
	}()
	proxy := acp.New(c, init.Workspace, init.Mount, logger.Printf)
	// An agent that does not exit when its input ends (the editor went
	// away) is asked to, then made to.
	proxy.ClientGone = func() {
		go func() {
			for _, s := range []os.Signal{syscall.SIGTERM, syscall.SIGKILL} {
				select {
				case <-time.After(agentGrace):
					stop <- s
				case e := <-exited:
					exited <- e
					return
				}
			}
		}()
	}
	proxy.Run(os.Stdin, os.Stdout, fromAgentR, toAgentW)
	e := <-exited
	if e.err != nil {
		return e.err
	}
	if e.res.Code != 0 {
		logger.Printf("the agent %s exited with status %d", argv[0], e.res.Code)
		return &exitStatus{e.res.Code}
	}
	return nil
}
