// Package plugin is the flock CNI plugin: a thin client that forwards each
// CNI op to the node agent over its unix socket and prints what comes back.
// It holds no state, so it can be exec'd concurrently without locking.
package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"code.fritzlab.net/fritzlab/flock/cni/wire"
)

// Supported are the CNI spec versions the plugin speaks.
var Supported = version.PluginSupports("0.3.1", "0.4.0", "1.0.0", "1.1.0")

// NetConf is the part of flock's network config the plugin reads (the
// agent gets all of it). Only these fields are decoded: every field is
// reflection work a short-lived process pays on each ADD.
type NetConf struct {
	CNIVersion string `json:"cniVersion"`
	// Socket is the agent's CNI socket (default /run/flock/cni.sock).
	Socket string `json:"socket,omitempty"`
	// TimeoutSeconds bounds one request to the agent (default 30).
	TimeoutSeconds int `json:"timeoutSeconds,omitempty"`
}

func parseConf(stdin []byte) (*NetConf, error) {
	var c NetConf
	if err := json.Unmarshal(stdin, &c); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "flock: network config is not valid JSON", err.Error())
	}
	if c.Socket == "" {
		c.Socket = wire.DefaultSocket
	}
	if c.TimeoutSeconds < 0 {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("flock: timeoutSeconds %d must not be negative", c.TimeoutSeconds), "")
	}
	if c.TimeoutSeconds == 0 {
		c.TimeoutSeconds = 30
	}
	return &c, nil
}

func call(op wire.Op, args *skel.CmdArgs, timeout time.Duration) (*NetConf, json.RawMessage, error) {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return nil, nil, err
	}
	if timeout == 0 {
		timeout = time.Duration(conf.TimeoutSeconds) * time.Second
	}
	client := wire.Client{Socket: conf.Socket, DialTimeout: 2 * time.Second, IOTimeout: timeout}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	resp, err := client.Call(ctx, wire.Request{
		Op: op, ContainerID: args.ContainerID, Netns: args.Netns, IfName: args.IfName,
		Args: args.Args, Config: args.StdinData,
	})
	if err != nil {
		if errors.Is(err, wire.ErrAgentNotRunning) {
			return nil, nil, types.NewError(types.ErrTryAgainLater, fmt.Sprintf("flock: the flock agent is not running (socket %s)", conf.Socket), err.Error())
		}
		return nil, nil, types.NewError(types.ErrIOFailure, fmt.Sprintf("flock: %s via %s failed", op, conf.Socket), err.Error())
	}
	if resp.Error != nil {
		return nil, nil, resp.Error
	}
	return conf, resp.Result, nil
}

// Add forwards ADD and prints the result in the caller's spec version. The
// agent answers in that version already: then the result is printed as it
// came, and converted here only when it is not (an older agent).
func Add(args *skel.CmdArgs) error {
	conf, raw, err := call(wire.OpAdd, args, 0)
	if err != nil {
		return err
	}
	var hdr struct {
		CNIVersion string `json:"cniVersion"`
	}
	if conf.CNIVersion != "" && json.Unmarshal(raw, &hdr) == nil && hdr.CNIVersion == conf.CNIVersion {
		_, err := os.Stdout.Write(append(raw, '\n'))
		return err
	}
	res, err := current.NewResult(raw)
	if err != nil {
		return types.NewError(types.ErrDecodingFailure, "flock: agent returned an unreadable result", err.Error())
	}
	return types.PrintResult(res, conf.CNIVersion)
}

// Del forwards DEL.
func Del(args *skel.CmdArgs) error { _, _, err := call(wire.OpDel, args, 0); return err }

// Check forwards CHECK (the agent compares the kernel with its record).
func Check(args *skel.CmdArgs) error { _, _, err := call(wire.OpCheck, args, 0); return err }

// GC forwards GC with the runtime's valid attachments.
func GC(args *skel.CmdArgs) error { _, _, err := call(wire.OpGC, args, 0); return err }

// Status asks the agent whether it can take ADDs.
func Status(args *skel.CmdArgs) error {
	_, _, err := call(wire.OpStatus, args, 5*time.Second)
	var te *types.Error
	if errors.As(err, &te) && te.Code == types.ErrTryAgainLater {
		// STATUS has its own code for "cannot serve ADD now".
		te.Code = types.ErrPluginNotAvailable
	}
	return err
}

// Main is the plugin's entry point.
func Main() {
	skel.PluginMainFuncs(skel.CNIFuncs{Add: Add, Del: Del, Check: Check, GC: GC, Status: Status}, Supported, "flock: pure-L3 IPv6-first CNI (forwards to flock-agent)")
}
