// Command rawrpc sends JSON-RPC requests to a stagefs socket (a path, or
// an abstract name starting with @) and prints each answer line: the tests
// run it inside the sandbox to show what the hook channel refuses.
//
//	rawrpc SOCKET METHOD [PARAMS_JSON] [METHOD [PARAMS_JSON]]...
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strings"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: rawrpc SOCKET METHOD [PARAMS_JSON]...")
		os.Exit(2)
	}
	conn, err := net.Dial("unix", os.Args[1])
	if err != nil {
		fmt.Println("dial:", err)
		os.Exit(1)
	}
	defer conn.Close()
	r := bufio.NewReader(conn)
	args := os.Args[2:]
	for id := 1; len(args) > 0; id++ {
		method, params := args[0], json.RawMessage("{}")
		args = args[1:]
		if len(args) > 0 && strings.HasPrefix(args[0], "{") {
			params, args = json.RawMessage(args[0]), args[1:]
		}
		req, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params})
		if _, err := conn.Write(append(req, '\n')); err != nil {
			fmt.Println("write:", err)
			os.Exit(1)
		}
		line, err := r.ReadString('\n')
		if err != nil {
			fmt.Println("read:", err)
			os.Exit(1)
		}
		fmt.Printf("%s %s", method, line)
	}
}
