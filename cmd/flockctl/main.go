// Command flockctl is the operator CLI: it reads the agent's admin socket.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"sigs.k8s.io/yaml"

	"code.fritzlab.net/fritzlab/flock/agent/admin"
)

const usage = `usage: flockctl [--socket PATH] [-o table|json|yaml] COMMAND

commands:
  bgp neighbors   BGP sessions: state, uptime, families, prefix counts, BFD, GR, warnings
  bgp routes      paths the node originates: prefix, kind, owning pods, advertised
  pods            allocations: container, pod, interface, veth, IPs
  ipam            pools with used and free addresses
  routes          anycast and addresses host routes in the kernel, with next hops
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
	switch cmd := strings.Join(fs.Args(), " "); cmd {
	case "pods":
		var v []admin.Pod
		if err := c.Get(ctx, "/v1/pods", &v); err != nil {
			return err
		}
		return emit(out, *format, v, func(w *tabwriter.Writer) {
			fmt.Fprintln(w, "CONTAINER\tPOD\tIFACE\tVETH\tIPS\tADDRESSES\tANYCAST\tAGE")
			for _, p := range v {
				fmt.Fprintf(w, "%s\t%s/%s\t%s\t%s\t%s\t%s\t%s\t%s\n", short(p.ContainerID), p.Namespace, p.Name, p.IfName, p.HostVeth,
					list(p.IPs), list(p.Addresses), list(p.Anycast), time.Since(p.Created).Round(time.Second))
			}
		})
	case "ipam":
		var v []admin.Pool
		if err := c.Get(ctx, "/v1/ipam", &v); err != nil {
			return err
		}
		return emit(out, *format, v, func(w *tabwriter.Writer) {
			fmt.Fprintln(w, "POOL\tKIND\tUSED\tFREE\tNAMESPACES")
			for _, p := range v {
				fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\n", p.CIDR, p.Kind, p.Used, p.Free, list(p.Namespaces))
			}
		})
	case "routes":
		var v []admin.Route
		if err := c.Get(ctx, "/v1/routes", &v); err != nil {
			return err
		}
		return emit(out, *format, v, func(w *tabwriter.Writer) {
			fmt.Fprintln(w, "PREFIX\tKIND\tNEXTHOPS\tOWNERS")
			for _, r := range v {
				owners := make([]string, 0, len(r.Owners))
				for _, o := range r.Owners {
					owners = append(owners, short(o))
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", r.Prefix, r.Kind, list(r.Nexthops), list(owners))
			}
		})
	case "bgp neighbors", "bgp neighbours", "bgp neighbor":
		var v []admin.Neighbor
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
				if n.LastError != "" && n.State != "Established" {
					warn = strings.TrimPrefix(warn+"; "+n.LastError, "; ")
				}
				uptime := n.Uptime
				if uptime == "" {
					uptime = "-"
				}
				fmt.Fprintf(w, "%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", peer, n.LocalASN, n.PeerASN, n.State, uptime, list(fams), n.BFD, n.GR, dash(warn))
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
