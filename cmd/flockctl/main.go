// Command flockctl is the operator CLI: it reads the agent's admin socket
// (and, for `policy`, flock-policy's).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"sigs.k8s.io/yaml"

	"code.fritzlab.net/fritzlab/flock/agent/admin"
	"code.fritzlab.net/fritzlab/flock/bgp/session"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/policyapi"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

const usage = `usage: flockctl [--socket PATH] [--policy-socket PATH] [-o table|json|yaml] COMMAND

commands:
  status                          agent health: recovery, sessions, route reconcilers (errors, last error), reaped allocations
  bgp neighbors                   BGP sessions: state, uptime, families, prefix counts, BFD, GR, warnings
  bgp routes                      paths the node originates: prefix, kind, owning pods, advertised
  pods                            attachments: container, pod, phase, readiness, interface, veth, IPs
  ipam                            pools with used, held and free addresses
  routes                          anycast and addresses host routes: in the kernel and as wanted, with next hops
  ready NAMESPACE/NAME true|false standalone mode: report a pod Ready or NotReady (its anycast and addresses
                                  IPs are advertised and routed only while Ready)
  policy [NAMESPACE/NAME]         NetworkPolicy (flock-policy): the node's pods, or the one named, with their IPs
                                  and the policies isolating their ingress and egress
`

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "flockctl:", err)
		os.Exit(1)
	}
}

func run(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("flockctl", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), usage); fs.PrintDefaults() }
	socket := fs.String("socket", admin.DefaultSocket, "agent admin socket")
	policySocket := fs.String("policy-socket", policyapi.DefaultSocket, "flock-policy's admin socket (the policy command)")
	format := fs.String("o", "table", "output format: table, json or yaml")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *format != "table" && *format != "json" && *format != "yaml" {
		return fmt.Errorf("-o %q: want table, json or yaml", *format)
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return errors.New("no command given")
	}
	c := admin.NewClient(*socket)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if fs.Arg(0) == "ready" {
		return ready(ctx, c, fs.Args()[1:], out)
	}
	if fs.Arg(0) == "policy" {
		return policy(ctx, *policySocket, *format, fs.Args()[1:], out)
	}
	switch cmd := strings.Join(fs.Args(), " "); cmd {
	case "status":
		var v admin.Status
		if err := c.Get(ctx, "/v1/status", &v); err != nil {
			return err
		}
		return emit(out, *format, v, func(w *tabwriter.Writer) {
			state := "recovering allocations"
			switch {
			case v.Ready && v.Installer != "":
				state = "serving, not Ready: the CNI installer refused"
			case v.Ready:
				state = "serving"
			}
			fmt.Fprintf(w, "AGENT\t%s\n", state)
			fmt.Fprintf(w, "ALLOCATIONS\t%d\n", v.Allocations)
			fmt.Fprintf(w, "BGP SESSIONS\t%d/%d established\n", v.PeersUp, v.Peers)
			if len(v.Reaped) > 0 {
				var rs []string
				for _, k := range sortedKeys(v.Reaped) {
					rs = append(rs, fmt.Sprintf("%s=%d", k, v.Reaped[k]))
				}
				fmt.Fprintf(w, "REAPED\t%s\n", strings.Join(rs, " "))
			}
			if v.ReapFailures > 0 {
				fmt.Fprintf(w, "REAP FAILURES\t%d (retried until they succeed)\n", v.ReapFailures)
			}
			if v.Installer != "" {
				fmt.Fprintf(w, "CNI INSTALLER\t%s\n", v.Installer)
			}
			if v.ConfigError != "" {
				fmt.Fprintf(w, "CONFIG ERROR\t%s\n", v.ConfigError)
			}
			for _, s := range v.Stuck {
				fmt.Fprintf(w, "STUCK\t%s\n", s)
			}
			fmt.Fprintln(w)
			fmt.Fprintln(w, "RECONCILER\tSTATE\tPASSES\tERRORS\tLAST ERROR")
			for _, r := range v.Reconcilers {
				st := "ok"
				if r.Failing {
					st = "FAILING"
				}
				last := "-"
				if r.LastError != "" {
					last = fmt.Sprintf("%s (%s ago)", r.LastError, time.Since(r.LastErrorAt).Round(time.Second))
				}
				fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%s\n", r.Target, st, r.Passes, r.Errors, last)
			}
		})
	case "pods":
		var v []admin.Pod
		if err := c.Get(ctx, "/v1/pods", &v); err != nil {
			return err
		}
		return emit(out, *format, v, func(w *tabwriter.Writer) {
			fmt.Fprintln(w, "CONTAINER\tPOD\tPHASE\tREADY\tIFACE\tVETH\tIPS\tADDRESSES\tANYCAST\tAGE")
			for _, p := range v {
				fmt.Fprintf(w, "%s\t%s/%s\t%s\t%v\t%s\t%s\t%s\t%s\t%s\t%s\n", short(p.ContainerID), p.Namespace, p.Name, p.Phase, p.Ready, p.IfName, p.HostVeth,
					list(p.IPs), list(p.Addresses), list(p.Anycast), time.Since(p.Created).Round(time.Second))
			}
		})
	case "ipam":
		var v []admin.Pool
		if err := c.Get(ctx, "/v1/ipam", &v); err != nil {
			return err
		}
		return emit(out, *format, v, func(w *tabwriter.Writer) {
			fmt.Fprintln(w, "POOL\tCIDR\tKIND\tUSE\tNAMESPACES\tCLAIMS\tUSED\tHELD\tFREE\tNOTE")
			for _, p := range v {
				who := list(p.Namespaces)
				if p.Selector != "" {
					who = strings.TrimPrefix(who+"; selector "+p.Selector, "-; ")
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\n", dash(p.Name), p.CIDR, p.Kind, list(p.Use), who, p.Claims, p.Used, p.Held, dash(p.Free), dash(p.Note))
			}
		})
	case "routes":
		var v []admin.Route
		if err := c.Get(ctx, "/v1/routes", &v); err != nil {
			return err
		}
		return emit(out, *format, v, func(w *tabwriter.Writer) {
			fmt.Fprintln(w, "PREFIX\tKIND\tNEXTHOPS (KERNEL)\tWANTED\tOWNERS\tSYNCED")
			for _, r := range v {
				owners := make([]string, 0, len(r.Owners))
				for _, o := range r.Owners {
					owners = append(owners, short(o))
				}
				kind := r.Kind
				if kind == "" {
					kind = "stale" // in the kernel, wanted by nobody: the reconciler removes it
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%v\n", r.Prefix, kind, list(r.Nexthops), list(r.Desired), list(owners), r.Synced)
			}
		})
	case "bgp neighbors", "bgp neighbours", "bgp neighbor":
		var v []session.Neighbor
		if err := c.Get(ctx, "/v1/bgp/neighbors", &v); err != nil {
			return err
		}
		return emit(out, *format, v, func(w *tabwriter.Writer) {
			fmt.Fprintln(w, "PEER\tLOCAL AS\tPEER AS\tSTATE\tUPTIME\tFAMILIES (RCVD/ACC/ADV)\tBFD\tGR\tWARNINGS")
			for _, n := range v {
				var fams []string
				for _, f := range n.Families {
					fams = append(fams, fmt.Sprintf("%s %d/%d/%d", f.Family, f.Received, f.Accepted, f.Advertised))
				}
				peer := n.Peer
				if n.Address != "" && n.Address != n.Peer {
					peer += " (" + n.Address + ")"
				}
				warn := strings.Join(n.Warnings, "; ")
				if n.LastError != "" && !n.Established() {
					warn = strings.TrimPrefix(warn+"; "+n.LastError, "; ")
				}
				uptime := "-"
				if n.Uptime > 0 {
					uptime = n.Uptime.String()
				}
				bfd := n.BFD
				if b := n.BFDDetail; b != nil && (b.Failures > 0 || b.PlannedDowns > 0 || b.Diag != "") {
					bfd += fmt.Sprintf(" (%d failures, %d planned", b.Failures, b.PlannedDowns)
					if b.Diag != "" {
						bfd += "; last: " + b.Diag
					}
					bfd += ")"
				}
				if b := n.BFDDetail; b != nil && b.SocketError != "" {
					warn = strings.TrimPrefix(warn+"; bfd socket ("+strconv.Itoa(b.SocketFailures)+" failures): "+b.SocketError, "; ")
				}
				fmt.Fprintf(w, "%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", peer, n.LocalASN, n.PeerASN, n.State, uptime, list(fams), bfd, n.GR, dash(warn))
			}
		})
	case "bgp routes":
		var v []admin.BGPRoute
		if err := c.Get(ctx, "/v1/bgp/routes", &v); err != nil {
			return err
		}
		return emit(out, *format, v, func(w *tabwriter.Writer) {
			fmt.Fprintln(w, "PREFIX\tKIND\tOWNERS\tADVERTISED")
			for _, r := range v {
				fmt.Fprintf(w, "%s\t%s\t%s\t%v\n", r.Prefix, r.Kind, list(r.Owners), r.Advertised)
			}
		})
	default:
		fs.Usage()
		return fmt.Errorf("unknown command %q", cmd)
	}
}

// ready reports a pod's readiness (standalone mode).
func ready(ctx context.Context, c *admin.Client, args []string, out io.Writer) error {
	if len(args) != 2 {
		return errors.New("usage: flockctl ready NAMESPACE/NAME true|false")
	}
	ns, name, ok := strings.Cut(args[0], "/")
	if !ok || ns == "" || name == "" {
		return fmt.Errorf("ready: pod %q: want NAMESPACE/NAME", args[0])
	}
	r, err := strconv.ParseBool(args[1])
	if err != nil {
		return fmt.Errorf("ready: %q: want true or false", args[1])
	}
	var resp struct{ Pods int }
	if err := c.Post(ctx, "/v1/pods/readiness", admin.Readiness{ID: podmeta.ID{Namespace: ns, Name: name}, Ready: r}, &resp); err != nil {
		return err
	}
	state := "NotReady"
	if r {
		state = "Ready"
	}
	_, err = fmt.Fprintf(out, "%s/%s: %s (%d incarnation(s))\n", ns, name, state, resp.Pods)
	return err
}

// errPolicyNotRunning means nothing answers on flock-policy's socket.
var errPolicyNotRunning = errors.New("flock-policy is not running")

// policy shows the NetworkPolicies isolating the node's pods, or one pod's.
func policy(ctx context.Context, socket, format string, args []string, out io.Writer) error {
	path := policyapi.PoliciesPath
	switch len(args) {
	case 0:
	case 1:
		ns, name, ok := strings.Cut(args[0], "/")
		if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
			return fmt.Errorf("policy: pod %q: want NAMESPACE/NAME", args[0])
		}
		path += "?" + url.Values{"pod": {args[0]}}.Encode()
	default:
		return errors.New("usage: flockctl policy [NAMESPACE/NAME]")
	}
	var v []policyapi.PodView
	if err := admin.NewClient(socket).Get(ctx, path, &v); err != nil {
		if errors.Is(err, admin.ErrNotRunning) {
			return fmt.Errorf("%w (nothing answers on %s; is the flock DaemonSet's policy container running, and is this the right --policy-socket?)", errPolicyNotRunning, socket)
		}
		return err
	}
	return emit(out, format, v, func(w *tabwriter.Writer) {
		fmt.Fprintln(w, "POD\tIPS\tINGRESS\tEGRESS")
		for _, p := range v {
			fmt.Fprintf(w, "%s/%s\t%s\t%s\t%s\n", p.Namespace, p.Name, list(p.IPs), list(p.Ingress), list(p.Egress))
		}
	})
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func emit(out io.Writer, format string, v any, table func(*tabwriter.Writer)) error {
	switch format {
	case "json":
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case "yaml":
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = out.Write(b)
		return err
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	table(w)
	return w.Flush()
}

func list(s []string) string {
	if len(s) == 0 {
		return "-"
	}
	return strings.Join(s, ",")
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}
