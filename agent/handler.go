package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"code.fritzlab.net/fritzlab/flock/cni/wire"
)

// netConf is the part of the network config the agent reads.
type netConf struct {
	CNIVersion    string          `json:"cniVersion"`
	RawPrevResult json.RawMessage `json:"prevResult,omitempty"`
	// ValidAttachments is a pointer: absent (refuse the GC) and empty
	// (nothing is valid) must not look alike.
	ValidAttachments *[]struct {
		ContainerID string `json:"containerID"`
		IfName      string `json:"ifname"`
	} `json:"cni.dev/valid-attachments,omitempty"`
}

// resultJSON encodes res in the config's spec version (the plugin prints
// it as it comes: it links no CNI library, so that its exec on every ADD
// costs little). A version the CNI library cannot convert to gets the
// agent's own; the plugin refuses configs in those before asking.
//
// Skew: plugins from before 2026-11-24 read only results of 1.0.0 and
// later, so with such a plugin a 0.x config's ADD fails until the plugin
// is upgraded (the DaemonSet's installer replaces it before the agent
// starts).
func resultJSON(res *current.Result, cniVersion string) (json.RawMessage, error) {
	var out types.Result = res
	if cniVersion != "" && cniVersion != res.CNIVersion {
		if r, err := res.GetAsVersion(cniVersion); err == nil {
			out = r
		}
	}
	return json.Marshal(out)
}

// Handle serves one wire request.
func (a *Agent) Handle(ctx context.Context, req wire.Request) wire.Response {
	var conf netConf
	if len(req.Config) > 0 {
		if err := json.Unmarshal(req.Config, &conf); err != nil {
			return wire.Response{Error: &types.Error{Code: types.ErrDecodingFailure, Msg: fmt.Sprintf("flock: network config: %v", err)}}
		}
	}
	switch req.Op {
	case wire.OpAdd:
		rec, err := a.Add(ctx, req.ContainerID, req.Netns, req.IfName, req.Args)
		if err != nil {
			a.log.Warn("ADD failed", "container", req.ContainerID, "err", err)
			return wire.Response{Error: ToCNI(err)}
		}
		raw, err := resultJSON(buildResult(rec), conf.CNIVersion)
		if err != nil {
			return wire.Response{Error: ToCNI(err)}
		}
		return wire.Response{Result: raw}
	case wire.OpDel:
		return wire.Response{Error: ToCNI(a.Del(ctx, req.ContainerID))}
	case wire.OpCheck:
		prev, err := prevIPs(conf)
		if err != nil {
			return wire.Response{Error: &types.Error{Code: types.ErrDecodingFailure, Msg: "flock: prevResult: " + err.Error()}}
		}
		return wire.Response{Error: ToCNI(a.Check(ctx, req.ContainerID, req.IfName, prev))}
	case wire.OpGC:
		if conf.ValidAttachments == nil {
			// Spec 1.1: GC deletes what the list leaves out, so a config
			// without the list would delete every attachment on the node.
			return wire.Response{Error: &types.Error{Code: types.ErrInvalidNetworkConfig, Msg: "flock: GC: the network config has no cni.dev/valid-attachments; refusing to delete every attachment on the node"}}
		}
		var valid []Attachment
		for _, v := range *conf.ValidAttachments {
			valid = append(valid, Attachment{ContainerID: v.ContainerID, IfName: v.IfName})
		}
		return wire.Response{Error: ToCNI(a.GC(ctx, valid))}
	case wire.OpStatus:
		return wire.Response{}
	}
	return wire.Response{Error: &types.Error{Code: types.ErrInvalidNetworkConfig, Msg: fmt.Sprintf("flock: unknown op %q", req.Op)}}
}

// prevIPs extracts the IPs of a CHECK's prevResult (nil when absent).
func prevIPs(conf netConf) ([]netip.Addr, error) {
	if len(conf.RawPrevResult) == 0 || string(conf.RawPrevResult) == "null" {
		return nil, nil
	}
	if conf.CNIVersion == "" {
		return nil, errors.New("cniVersion missing")
	}
	r, err := version.NewResult(conf.CNIVersion, conf.RawPrevResult)
	if err != nil {
		return nil, err
	}
	res, err := current.NewResultFromResult(r)
	if err != nil {
		return nil, err
	}
	out := []netip.Addr{}
	for i, ip := range res.IPs {
		a, ok := netip.AddrFromSlice(ip.Address.IP)
		if !ok {
			return nil, fmt.Errorf("prevResult.ips[%d].address: %q is not an IP address", i, ip.Address.String())
		}
		out = append(out, a.Unmap())
	}
	return out, nil
}
