// Command gobgp-baseline is the memory baseline of `make bench`: an
// embedded GoBGP and nothing else, set up as the agent sets it up (RIBs
// for IPv4 and IPv6 unicast only), peered with the ToR the way the agent
// is, originating as many paths as it is told to ("add N <base address>"
// on stdin; it answers "ok"). Built like the agent (-trimpath -s -w).
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"strconv"
	"strings"

	api "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/osrg/gobgp/v4/pkg/server"
)

func main() {
	local := flag.String("local", "", "local address")
	peer := flag.String("peer", "", "the ToR's address")
	asn := flag.Uint("asn", 64512, "our AS")
	peerASN := flag.Uint("peer-asn", 64513, "the ToR's AS")
	flag.Parse()
	if err := run(*local, *peer, uint32(*asn), uint32(*peerASN)); err != nil {
		fmt.Fprintln(os.Stderr, "gobgp-baseline:", err)
		os.Exit(1)
	}
}

func run(local, peer string, asn, peerASN uint32) error {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	lv := new(slog.LevelVar)
	lv.Set(slog.LevelError)
	srv := server.NewBgpServer(server.LoggerOption(log, lv))
	go srv.Serve()
	ctx := context.Background()
	if err := srv.StartBgp(ctx, &api.StartBgpRequest{Global: &api.Global{Asn: asn, RouterId: "10.255.0.99", ListenPort: -1, Families: []uint32{0, 1}}}); err != nil {
		return err
	}
	fam := func(a api.Family_Afi) *api.AfiSafi {
		return &api.AfiSafi{Config: &api.AfiSafiConfig{Family: &api.Family{Afi: a, Safi: api.Family_SAFI_UNICAST}, Enabled: true},
			MpGracefulRestart: &api.MpGracefulRestart{Config: &api.MpGracefulRestartConfig{Enabled: true}}}
	}
	if err := srv.AddPeer(ctx, &api.AddPeerRequest{Peer: &api.Peer{
		Conf:            &api.PeerConf{NeighborAddress: peer, PeerAsn: peerASN},
		Timers:          &api.Timers{Config: &api.TimersConfig{HoldTime: 9, KeepaliveInterval: 3, ConnectRetry: 1}},
		Transport:       &api.Transport{LocalAddress: local},
		GracefulRestart: &api.GracefulRestart{Enabled: true, RestartTime: 120},
		AfiSafis:        []*api.AfiSafi{fam(api.Family_AFI_IP6), fam(api.Family_AFI_IP)},
	}}); err != nil {
		return err
	}
	fmt.Println("ready")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 3 || f[0] != "add" {
			return fmt.Errorf("baseline: unknown command %q", sc.Text())
		}
		n, err := strconv.Atoi(f[1])
		if err != nil {
			return err
		}
		base := netip.MustParseAddr(f[2]).As16()
		paths := make([]*apiutil.Path, 0, n)
		for i := range n {
			a := base
			a[12], a[13], a[14], a[15] = byte(i>>24), byte(i>>16), byte(i>>8), byte(i)
			nlri, err := bgp.NewIPAddrPrefix(netip.PrefixFrom(netip.AddrFrom16(a), 128))
			if err != nil {
				return err
			}
			mp, err := bgp.NewPathAttributeMpReachNLRI(bgp.RF_IPv6_UC, []bgp.PathNLRI{{NLRI: nlri}}, netip.IPv6Unspecified())
			if err != nil {
				return err
			}
			paths = append(paths, &apiutil.Path{Family: bgp.RF_IPv6_UC, Nlri: nlri, Attrs: []bgp.PathAttributeInterface{bgp.NewPathAttributeOrigin(0), mp}})
		}
		if _, err := srv.AddPath(apiutil.AddPathRequest{Paths: paths}); err != nil {
			return err
		}
		fmt.Println("ok")
	}
	return sc.Err()
}
