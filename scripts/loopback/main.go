// Command loopback is a bare go-fuse loopback with go-fuse's default
// options: the reference scripts/bench compares stagefs with.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: loopback DIR MOUNTPOINT")
		os.Exit(2)
	}
	root, err := fs.NewLoopbackRoot(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	server, err := fs.Mount(os.Args[2], root, &fs.Options{
		MountOptions: fuse.MountOptions{DirectMount: os.Geteuid() == 0, FsName: "loopback", Name: "loopback"},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() { <-sigs; server.Unmount() }()
	fmt.Println("ready")
	server.Wait()
}
