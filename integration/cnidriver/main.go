// cnidriver: a minimal stand-in for cnitool, built only when the Go module proxy
// is unreachable (scripts/setup falls back to it). It is built in GOPATH mode
// against Debian's golang-github-appc-cni-dev (libcni 1.1.2, CNI spec up to
// 1.0.0), so it knows add, check and del only; no status or gc.
//
// Usage mirrors cnitool:
//
//	cnidriver add|check|del <network name> <netns path>
//
// Environment (as cnitool): NETCONFPATH (conflist dir, default /etc/cni/net.d),
// CNI_PATH (plugin dirs), CNI_IFNAME (default eth0), CNI_ARGS, CAP_ARGS; plus
// CNI_CACHE_DIR (libcni's result cache, default /var/lib/cni), which cnitool has
// no way to set. The container ID is derived from the netns path the same way
// cnitool derives it ("cnitool-" + first 10 bytes of its SHA-512, hex).
package main

import (
	"context"
	"crypto/sha512"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/libcni"
)

func usage() {
	fmt.Fprintf(os.Stderr, "usage: %s add|check|del <net> <netns>\n", filepath.Base(os.Args[0]))
	os.Exit(2)
}

func fail(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func parseArgs(args string) ([][2]string, error) {
	var out [][2]string
	for _, pair := range strings.Split(args, ";") {
		kv := strings.SplitN(pair, "=", 2)
		if len(kv) != 2 || kv[0] == "" || kv[1] == "" {
			return nil, fmt.Errorf("invalid CNI_ARGS pair %q", pair)
		}
		out = append(out, [2]string{kv[0], kv[1]})
	}
	return out, nil
}

func main() {
	if len(os.Args) != 4 {
		usage()
	}
	netdir := os.Getenv("NETCONFPATH")
	if netdir == "" {
		netdir = "/etc/cni/net.d"
	}
	list, err := libcni.LoadConfList(netdir, os.Args[2])
	fail(err)

	var capArgs map[string]interface{}
	if v := os.Getenv("CAP_ARGS"); v != "" {
		fail(json.Unmarshal([]byte(v), &capArgs))
	}
	var cniArgs [][2]string
	if v := os.Getenv("CNI_ARGS"); v != "" {
		cniArgs, err = parseArgs(v)
		fail(err)
	}
	ifName, ok := os.LookupEnv("CNI_IFNAME")
	if !ok {
		ifName = "eth0"
	}
	netns, err := filepath.Abs(os.Args[3])
	fail(err)
	sum := sha512.Sum512([]byte(netns))
	containerID := fmt.Sprintf("cnitool-%x", sum[:10])

	cni := libcni.NewCNIConfigWithCacheDir(filepath.SplitList(os.Getenv("CNI_PATH")), os.Getenv("CNI_CACHE_DIR"), nil)
	rt := &libcni.RuntimeConf{
		ContainerID:    containerID,
		NetNS:          netns,
		IfName:         ifName,
		Args:           cniArgs,
		CapabilityArgs: capArgs,
	}
	ctx := context.Background()
	switch os.Args[1] {
	case "add":
		result, err := cni.AddNetworkList(ctx, list, rt)
		if result != nil {
			_ = result.Print()
		}
		fail(err)
	case "check":
		fail(cni.CheckNetworkList(ctx, list, rt))
	case "del":
		fail(cni.DelNetworkList(ctx, list, rt))
	default:
		usage()
	}
}
