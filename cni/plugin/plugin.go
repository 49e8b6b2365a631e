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
	"syscall"
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

// Timeouts of STATUS: runtimes poll it every few seconds and wait for it.
// During a planned restart (a fresh restart marker) the new agent may hold
// the call in its socket's backlog while it recovers: the node stays
// Ready meanwhile, so STATUS need not wait long to learn nothing new.
const (
	statusTimeout           = 5 * time.Second
	restartingStatusTimeout = time.Second
)

// ask sends one request. An error means the agent gave no answer.
func ask(conf *NetConf, op wire.Op, args *skel.CmdArgs, timeout time.Duration) (wire.Response, error) {
	client := wire.Client{Socket: conf.Socket, DialTimeout: min(2*time.Second, timeout), IOTimeout: timeout}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return client.Call(ctx, wire.Request{
		Op: op, ContainerID: args.ContainerID, Netns: args.Netns, IfName: args.IfName,
		Args: args.Args, Config: args.StdinData,
	})
}

// unanswered is the CNI error for a request the agent did not answer:
// code 11 (try again later) while it restarts or is not running.
func unanswered(conf *NetConf, op wire.Op, err error) *types.Error {
	if r, ok := wire.Restarting(conf.Socket, time.Now()); ok {
		return types.NewError(types.ErrTryAgainLater, fmt.Sprintf("flock: the flock agent is restarting (a planned stop, expected back by %s; socket %s): try again",
			r.Until.UTC().Format(time.RFC3339), conf.Socket), err.Error())
	}
	if errors.Is(err, wire.ErrAgentNotRunning) {
		return types.NewError(types.ErrTryAgainLater, fmt.Sprintf("flock: the flock agent is not running (socket %s)", conf.Socket), err.Error())
	}
	return types.NewError(types.ErrIOFailure, fmt.Sprintf("flock: %s via %s failed", op, conf.Socket), err.Error())
}

func call(op wire.Op, args *skel.CmdArgs) (*NetConf, json.RawMessage, error) {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return nil, nil, err
	}
	resp, err := ask(conf, op, args, time.Duration(conf.TimeoutSeconds)*time.Second)
	if err != nil {
		return nil, nil, unanswered(conf, op, err)
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
	conf, raw, err := call(wire.OpAdd, args)
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

// Del forwards DEL. With no agent to answer, a DEL of a sandbox whose
// network namespace is gone succeeds: after a reboot the runtime tears
// the dead sandboxes down before the agent (a pod itself) is back, and
// nothing is left to do here — the veth went with the namespace, and the
// agent reaps the allocation when it starts (its namespace is gone),
// giving back its addresses and claims. Any other unanswered DEL fails,
// for the runtime to retry.
func Del(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	resp, err := ask(conf, wire.OpDel, args, time.Duration(conf.TimeoutSeconds)*time.Second)
	if err != nil {
		if errors.Is(err, wire.ErrAgentNotRunning) && netnsGone(args.Netns) {
			return nil
		}
		return unanswered(conf, wire.OpDel, err)
	}
	if resp.Error != nil {
		return resp.Error
	}
	return nil
}

// nsfsMagic is the statfs type of a mounted network namespace.
const nsfsMagic = 0x6e736673

// netnsGone tells whether path no longer is a network namespace: none
// given, missing (a reboot emptied /run), or a bind mount's file left
// without its mount.
func netnsGone(path string) bool {
	if path == "" {
		return true
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return errors.Is(err, os.ErrNotExist)
	}
	return st.Type != nsfsMagic
}

// Check forwards CHECK (the agent compares the kernel with its record).
func Check(args *skel.CmdArgs) error { _, _, err := call(wire.OpCheck, args); return err }

// GC forwards GC with the runtime's valid attachments.
func GC(args *skel.CmdArgs) error { _, _, err := call(wire.OpGC, args); return err }

// Status asks the agent whether it can take ADDs. While a planned
// restart is under way (a fresh restart marker) and the agent does not
// answer, it succeeds: the runtime keeps the node Ready through a
// rollout. A crash leaves no marker, and STATUS fails.
func Status(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	timeout := statusTimeout
	_, restarting := wire.Restarting(conf.Socket, time.Now())
	if restarting {
		timeout = restartingStatusTimeout
	}
	resp, err := ask(conf, wire.OpStatus, args, timeout)
	switch {
	case err != nil && restarting:
		return nil
	case err != nil:
		te := unanswered(conf, wire.OpStatus, err)
		if te.Code == types.ErrTryAgainLater {
			// STATUS has its own code for "cannot serve ADD now".
			te.Code = types.ErrPluginNotAvailable
		}
		return te
	case resp.Error != nil:
		return resp.Error
	}
	return nil
}

// Main is the plugin's entry point.
func Main() {
	skel.PluginMainFuncs(skel.CNIFuncs{Add: Add, Del: Del, Check: Check, GC: GC, Status: Status}, Supported, "flock: pure-L3 IPv6-first CNI (forwards to flock-agent)")
}
