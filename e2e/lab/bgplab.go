package lab

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"text/template"
	"time"
)

// TorASN and NodeASN are the lab's AS numbers.
const (
	TorASN  = 64513
	NodeASN = 64512
)

// LabNode is one node of a BGP lab: a namespace with an uplink to the ToR
// and an agent.
type LabNode struct {
	Name         string
	Index        int // 1-based
	NS           *NS
	Uplink       string     // node side of the ToR link
	TorIf        string     // ToR side
	V6, V4       netip.Addr // node uplink addresses
	TorV6, TorV4 netip.Addr // ToR addresses on this link
	Summary6     netip.Prefix
	Summary4     netip.Prefix
	Agent        *Agent
	CNI          *CNI
}

// LabOptions shape a lab.
type LabOptions struct {
	Prefix string // namespace name prefix, unique per lab
	Dir    string // for configs, sockets and state
	BinDir string // flock binaries
	Nodes  int
	// NodeConfig renders a node's NodeConfig; nil means DefaultNodeConfig.
	NodeConfig func(n *LabNode) string
	// AgentArgs are extra flock-agent flags.
	AgentArgs []string
	// Kubeconfig, if set, runs the agents in Kubernetes mode (node name =
	// the lab node's name); Setup then runs in each node namespace before
	// its agent starts (e.g. an API proxy).
	Kubeconfig string
	Setup      func(n *LabNode) error
	// SkipAgent leaves a node without an agent (its namespace and link
	// exist; the caller runs something else there).
	SkipAgent func(n *LabNode) bool
}

// BGPLab is a ToR namespace plus nodes, each joined to the ToR by a veth.
type BGPLab struct {
	Opts   LabOptions
	Tor    *NS
	Nodes  []*LabNode
	Bird   *Bird
	FRR    *FRR
	frrDir string
	spaces []*NS
}

// NewBGPLab builds the namespaces and links, and starts an agent on every
// node. The ToR routing daemon is started separately (StartBird, StartFRR).
func NewBGPLab(o LabOptions) (*BGPLab, error) {
	l := &BGPLab{Opts: o}
	ok := false
	defer func() {
		if !ok {
			l.Close()
		}
	}()
	tor, err := NewNS(o.Prefix + "tor")
	if err != nil {
		return nil, err
	}
	l.Tor = tor
	l.spaces = append(l.spaces, tor)
	for _, k := range []string{"net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding"} {
		if err := tor.Sysctl(k, "1"); err != nil {
			return nil, err
		}
	}
	// The ToR's own addresses, for pings from the ToR.
	if err := tor.AddAddr(netip.MustParseAddr("fd00:ff::1")); err != nil {
		return nil, err
	}
	for i := 1; i <= o.Nodes; i++ {
		n := &LabNode{
			Name: fmt.Sprintf("node%d", i), Index: i,
			Uplink: "uplink", TorIf: fmt.Sprintf("to-node%d", i),
			V6: netip.MustParseAddr(fmt.Sprintf("fd00:0:%d::1", i)), TorV6: netip.MustParseAddr(fmt.Sprintf("fd00:0:%d::2", i)),
			V4: netip.AddrFrom4([4]byte{192, 0, 2, byte(4*(i-1) + 1)}), TorV4: netip.AddrFrom4([4]byte{192, 0, 2, byte(4*(i-1) + 2)}),
			Summary6: netip.MustParsePrefix(fmt.Sprintf("fd00:10:%d::/64", i)),
			Summary4: netip.MustParsePrefix(fmt.Sprintf("10.10.%d.0/24", i)),
		}
		ns, err := NewNS(fmt.Sprintf("%snode%d", o.Prefix, i))
		if err != nil {
			return nil, err
		}
		n.NS = ns
		l.spaces = append(l.spaces, ns)
		if err := Connect(ns, n.Uplink, tor, n.TorIf); err != nil {
			return nil, err
		}
		for _, a := range []struct {
			ns  *NS
			If  string
			pfx netip.Prefix
		}{
			{ns, n.Uplink, netip.PrefixFrom(n.V6, 64)}, {ns, n.Uplink, netip.PrefixFrom(n.V4, 30)},
			{tor, n.TorIf, netip.PrefixFrom(n.TorV6, 64)}, {tor, n.TorIf, netip.PrefixFrom(n.TorV4, 30)},
		} {
			if err := a.ns.AddrAdd(a.If, a.pfx); err != nil {
				return nil, err
			}
		}
		// Nodes import nothing from BGP: their way out is a static default.
		if err := ns.RouteAdd(netip.MustParsePrefix("::/0"), n.TorV6); err != nil {
			return nil, err
		}
		if err := ns.RouteAdd(netip.MustParsePrefix("0.0.0.0/0"), n.TorV4); err != nil {
			return nil, err
		}
		l.Nodes = append(l.Nodes, n)
	}
	for _, n := range l.Nodes {
		if l.Opts.Setup != nil {
			if err := l.Opts.Setup(n); err != nil {
				return nil, err
			}
		}
		if l.Opts.SkipAgent != nil && l.Opts.SkipAgent(n) {
			continue
		}
		if err := l.StartAgent(n); err != nil {
			return nil, err
		}
	}
	ok = true
	return l, nil
}

// StartAgent (re)starts the node's agent with its rendered NodeConfig.
func (l *BGPLab) StartAgent(n *LabNode) error {
	render := l.Opts.NodeConfig
	if render == nil {
		render = DefaultNodeConfig
	}
	dir := filepath.Join(l.Opts.Dir, n.Name)
	if n.Agent == nil {
		a, err := NewAgent(n.NS, dir, render(n))
		if err != nil {
			return err
		}
		a.Args = l.Opts.AgentArgs
		a.Kubeconfig, a.NodeName = l.Opts.Kubeconfig, n.Name
		n.Agent = a
		c, err := NewCNI(l.Opts.BinDir, filepath.Join(dir, "cni-cache"), a.CNISocket, "1.1.0")
		if err != nil {
			return err
		}
		n.CNI = c
	}
	return n.Agent.Start(filepath.Join(l.Opts.BinDir, "flock-agent"), 30*time.Second)
}

// SetNodeConfig rewrites a node's config file (the agent reloads it).
func (l *BGPLab) SetNodeConfig(n *LabNode, yaml string) error {
	tmp := n.Agent.ConfigPath + ".tmp"
	if err := os.WriteFile(tmp, []byte(yaml), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, n.Agent.ConfigPath)
}

// DefaultNodeConfig peers the node with the ToR over IPv6, carrying both
// families (RFC 5549), with lab timers.
func DefaultNodeConfig(n *LabNode) string {
	return NodeConfigYAML(n, fmt.Sprintf(`- address: %s
  asn: %d
  localAddress: %s
  timers: {holdTime: 9, keepaliveTime: 3, connectRetry: 1}
`, n.TorV6, TorASN, n.V6))
}

func indent(s, by string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = by + l
	}
	return strings.Join(lines, "\n") + "\n"
}

// NodeConfigYAML renders a node's NodeConfig with the given peers block
// (a YAML list, unindented).
func NodeConfigYAML(n *LabNode, peers string) string {
	return fmt.Sprintf(`apiVersion: flock.fritzlab.net/v1alpha1
kind: NodeConfig
metadata:
  name: %s
spec:
  asn: %d
  routerID: 10.255.0.%d
  defaults:
    ipv4: true
  pools:
  - cidr: %s
  - cidr: %s
  bgp:
    peers:
%s%s`, n.Name, NodeASN, 10+n.Index, n.Summary6, n.Summary4, indent(peers, "    "), LabAddressPools)
}

// LabAddressPools are the lab's AddressPools (documents appended to every
// node's config): pod addresses from a cluster-wide range, anycast and
// `addresses` IPs, for namespace default. Uniqueness across standalone
// nodes is per node only: tests give each node its own slice of the range.
const LabAddressPools = `---
apiVersion: flock.fritzlab.net/v1alpha1
kind: AddressPool
metadata:
  name: lab-pods
spec:
  cidrs: [2001:db8:100::/112, 198.51.100.0/28]
  use: [pod]
  namespaces: [default]
---
apiVersion: flock.fritzlab.net/v1alpha1
kind: AddressPool
metadata:
  name: lab-anycast
spec:
  cidrs: [2001:db8:a::/64, 203.0.113.0/24]
  use: [anycast]
  namespaces: [default]
---
apiVersion: flock.fritzlab.net/v1alpha1
kind: AddressPool
metadata:
  name: lab-addresses
spec:
  cidrs: [2001:db8:aa::/64]
  use: [addresses]
  namespaces: [default]
`

// BirdOptions vary the ToR's BIRD config.
type BirdOptions struct {
	NoExtendedNextHop bool // the RFC 5549 mismatch scenario
	MD5Password       string
	GR, BFD           bool
	// BFDGraceful: `bfd graceful` (Debian 12's BIRD 2.0.12 has it): a BFD session going
	// down triggers graceful restart rather than a session teardown.
	BFDGraceful bool
	// Unnumbered peers the given node indexes over link-local instead.
	Unnumbered map[int]netip.Addr // node index → node link-local
	// IPv4Sessions adds a second, IPv4-only session to every node
	// (protocol <node>v4, node address <V4>).
	IPv4Sessions bool
}

var birdTmpl = template.Must(template.New("bird").Parse(`# ToR (BIRD 2), generated by the flock lab
log "{{.Dir}}/bird.log" all;
router id 10.255.0.1;
protocol device { scan time 2; }
protocol direct { ipv4; ipv6; interface "to-*"; }
protocol kernel k4 { ipv4 { import none; export where source = RTS_BGP; }; merge paths on; }
protocol kernel k6 { ipv6 { import none; export where source = RTS_BGP; }; merge paths on; }
{{- if .BFD}}
protocol bfd { interface "to-*" { min rx interval 300 ms; min tx interval 300 ms; multiplier 3; }; }
{{- end}}
template bgp flock {
  local as {{.TorASN}};
  hold time 9; keepalive time 3; connect retry time 1;
  # Reconnect to a restarted agent within a second (default 5 s): until
  # then a graceful-restart helper keeps its routes stale, including those
  # of pods that vanished while it was down.
  connect delay time 1;
{{- if .GR}}
  graceful restart on;
{{- end}}
{{- if .BFDGraceful}}
  # A BFD Down (the node's AdminDown on a planned stop, or its agent
  # crashing) starts graceful restart instead of flushing the routes.
  bfd graceful;
{{- else if .BFD}}
  bfd on;
{{- end}}
{{- if .Password}}
  password "{{.Password}}";
{{- end}}
  ipv6 { import all; export none; };
  ipv4 { import all; export none;{{if not .NoENH}} extended next hop on;{{end}} };
}
{{- range .Nodes}}
{{- if .LL}}
protocol bgp {{.Name}} from flock {
  interface "{{.TorIf}}";
  neighbor {{.LL}} as {{$.NodeASN}};
}
{{- else}}
protocol bgp {{.Name}} from flock {
  local {{.TorV6}} as {{$.TorASN}};
  neighbor {{.V6}} as {{$.NodeASN}};
}
{{- end}}
{{- if $.IPv4Sessions}}
protocol bgp {{.Name}}v4 {
  local {{.TorV4}} as {{$.TorASN}};
  neighbor {{.V4}} as {{$.NodeASN}};
  hold time 9; keepalive time 3; connect retry time 1;
  ipv4 { import all; export none; };
}
{{- end}}
{{- end}}
`))

// BirdConfig renders the ToR config for the lab's nodes.
func (l *BGPLab) BirdConfig(o BirdOptions) string {
	type node struct {
		Name, TorIf string
		V6, TorV6   netip.Addr
		V4, TorV4   netip.Addr
		LL          string
	}
	data := struct {
		Dir             string
		TorASN, NodeASN int
		GR, BFD, NoENH  bool
		BFDGraceful     bool
		IPv4Sessions    bool
		Password        string
		Nodes           []node
	}{Dir: filepath.Join(l.Opts.Dir, "tor"), TorASN: TorASN, NodeASN: NodeASN, GR: o.GR, BFD: o.BFD || o.BFDGraceful, BFDGraceful: o.BFDGraceful, NoENH: o.NoExtendedNextHop, Password: o.MD5Password, IPv4Sessions: o.IPv4Sessions}
	for _, n := range l.Nodes {
		nd := node{Name: n.Name, TorIf: n.TorIf, V6: n.V6, TorV6: n.TorV6, V4: n.V4, TorV4: n.TorV4}
		if ll, ok := o.Unnumbered[n.Index]; ok {
			nd.LL = ll.String()
		}
		data.Nodes = append(data.Nodes, nd)
	}
	var b strings.Builder
	if err := birdTmpl.Execute(&b, data); err != nil {
		panic(err)
	}
	return b.String()
}

// StartBird runs BIRD as the ToR.
func (l *BGPLab) StartBird(o BirdOptions) error {
	b, err := StartBird(l.Tor, filepath.Join(l.Opts.Dir, "tor"), l.BirdConfig(o))
	if err != nil {
		return err
	}
	l.Bird = b
	return nil
}

// Close stops every process the lab started and deletes its namespaces.
func (l *BGPLab) Close() error {
	var errs []error
	for _, n := range l.Nodes {
		if n.Agent != nil {
			if err := n.Agent.Stop(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if l.Bird != nil {
		l.Bird.Stop()
	}
	if l.FRR != nil {
		l.FRR.Stop()
	}
	for _, ns := range l.spaces {
		if err := ns.Delete(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
