package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
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
	"code.fritzlab.net/fritzlab/flock/k8s/services"
)

// view is a command that reads one admin API path from the agent and
// prints it: a table (wide: with more columns), or JSON or YAML as read.
func view[T any](path string, table func(w *tabwriter.Writer, v T, wide bool)) func(context.Context, *options, []string, io.Writer) error {
	return func(ctx context.Context, o *options, _ []string, out io.Writer) error {
		var v T
		if err := admin.NewClient(o.socket).Get(ctx, path, &v); err != nil {
			return err
		}
		return emit(out, o.format, v, func(w *tabwriter.Writer) { table(w, v, o.wide()) })
	}
}

var statusCmd = view("/v1/status", func(w *tabwriter.Writer, v admin.Status, wide bool) {
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
	if wide {
		for _, p := range v.Problems {
			fmt.Fprintf(w, "PROBLEM\t%s\n", p)
		}
	}
	fmt.Fprintln(w)
	if wide {
		fmt.Fprintln(w, "RECONCILER\tSTATE\tPASSES\tERRORS\tGENERATION\tLAST SUCCESS\tLAST ERROR")
	} else {
		fmt.Fprintln(w, "RECONCILER\tSTATE\tPASSES\tERRORS\tLAST ERROR")
	}
	for _, r := range v.Reconcilers {
		st := "ok"
		if r.Failing {
			st = "FAILING"
		}
		last := "-"
		if r.LastError != "" {
			last = fmt.Sprintf("%s (%s ago)", r.LastError, time.Since(r.LastErrorAt).Round(time.Second))
		}
		if wide {
			fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%s\t%s\n", r.Target, st, r.Passes, r.Errors, r.Generation, ago(r.LastSuccess), last)
			continue
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%s\n", r.Target, st, r.Passes, r.Errors, last)
	}
})

var podsCmd = view("/v1/pods", func(w *tabwriter.Writer, v []admin.Pod, wide bool) {
	if wide {
		fmt.Fprintln(w, "CONTAINER\tPOD\tUID\tPHASE\tREADY\tIFACE\tVETH\tIPS\tADDRESSES\tANYCAST\tCREATED\tAGE")
	} else {
		fmt.Fprintln(w, "CONTAINER\tPOD\tPHASE\tREADY\tIFACE\tVETH\tIPS\tADDRESSES\tANYCAST\tAGE")
	}
	for _, p := range v {
		age := time.Since(p.Created).Round(time.Second)
		if wide {
			uid := p.UID
			if p.StaticUID != "" {
				uid = p.StaticUID + " (static)"
			}
			fmt.Fprintf(w, "%s\t%s/%s\t%s\t%s\t%v\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.ContainerID, p.Namespace, p.Name, dash(uid), p.Phase, p.Ready, p.IfName, p.HostVeth,
				list(p.IPs), list(p.Addresses), list(p.Anycast), timestamp(p.Created), age)
			continue
		}
		fmt.Fprintf(w, "%s\t%s/%s\t%s\t%v\t%s\t%s\t%s\t%s\t%s\t%s\n", short(p.ContainerID), p.Namespace, p.Name, p.Phase, p.Ready, p.IfName, p.HostVeth,
			list(p.IPs), list(p.Addresses), list(p.Anycast), age)
	}
})

var ipamCmd = view("/v1/ipam", func(w *tabwriter.Writer, v []admin.Pool, wide bool) {
	if wide {
		fmt.Fprintln(w, "POOL\tCIDR\tKIND\tUSE\tNAMESPACES\tSELECTOR\tCLAIMS\tUSED\tHELD\tFREE\tNOTE")
	} else {
		fmt.Fprintln(w, "POOL\tCIDR\tKIND\tUSE\tNAMESPACES\tCLAIMS\tUSED\tHELD\tFREE\tNOTE")
	}
	for _, p := range v {
		if wide {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\n", dash(p.Name), p.CIDR, p.Kind, list(p.Use), list(p.Namespaces), dash(p.Selector),
				p.Claims, p.Used, p.Held, dash(p.Free), dash(p.Note))
			continue
		}
		who := list(p.Namespaces)
		if p.Selector != "" {
			who = strings.TrimPrefix(who+"; selector "+p.Selector, "-; ")
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\n", dash(p.Name), p.CIDR, p.Kind, list(p.Use), who, p.Claims, p.Used, p.Held, dash(p.Free), dash(p.Note))
	}
})

var routesCmd = view("/v1/routes", func(w *tabwriter.Writer, v []admin.Route, wide bool) {
	fmt.Fprintln(w, "PREFIX\tKIND\tNEXTHOPS (KERNEL)\tWANTED\tOWNERS\tSYNCED")
	for _, r := range v {
		owners := make([]string, 0, len(r.Owners))
		for _, o := range r.Owners {
			if !wide {
				o = short(o)
			}
			owners = append(owners, o)
		}
		kind := r.Kind
		if kind == "" {
			kind = "stale" // in the kernel, wanted by nobody: the reconciler removes it
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%v\n", r.Prefix, kind, list(r.Nexthops), list(r.Desired), list(owners), r.Synced)
	}
})

var neighborsCmd = view("/v1/bgp/neighbors", func(w *tabwriter.Writer, v []session.Neighbor, wide bool) {
	if wide {
		fmt.Fprintln(w, "PEER\tADDRESS\tLOCAL AS\tPEER AS\tSTATE\tSINCE\tUPTIME\tFAMILIES (RCVD/ACC/ADV)\tBFD\tBFD REMOTE\tBFD FAILURES/PLANNED\tBFD DIAG\tGR\tRFC5549\tWARNINGS\tLAST ERROR")
	} else {
		fmt.Fprintln(w, "PEER\tLOCAL AS\tPEER AS\tSTATE\tUPTIME\tFAMILIES (RCVD/ACC/ADV)\tBFD\tGR\tWARNINGS")
	}
	for _, n := range v {
		var fams []string
		for _, f := range n.Families {
			fams = append(fams, fmt.Sprintf("%s %d/%d/%d", f.Family, f.Received, f.Accepted, f.Advertised))
		}
		uptime := "-"
		if n.Uptime > 0 {
			uptime = n.Uptime.String()
		}
		warn := strings.Join(n.Warnings, "; ")
		if b := n.BFDDetail; b != nil && b.SocketError != "" && wide {
			warn = strings.TrimPrefix(warn+"; bfd socket ("+strconv.Itoa(b.SocketFailures)+" failures): "+b.SocketError, "; ")
		}
		if wide {
			remote, counts, diag := "-", "-", "-"
			if b := n.BFDDetail; b != nil {
				remote = dash(b.RemoteState)
				if b.RemoteCBit {
					remote += " (C-bit)"
				}
				counts = fmt.Sprintf("%d/%d", b.Failures, b.PlannedDowns)
				diag = dash(b.Diag)
			}
			guard := "-"
			if n.RFC5549Mismatch {
				guard = "holding IPv4 back"
			}
			fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.Peer, dash(n.Address), n.LocalASN, n.PeerASN, n.State,
				timestamp(n.Since), uptime, list(fams), dash(n.BFD), remote, counts, diag, dash(n.GR), guard, dash(warn), dash(n.LastError))
			continue
		}
		peer := n.Peer
		if n.Address != "" && n.Address != n.Peer {
			peer += " (" + n.Address + ")"
		}
		if n.LastError != "" && !n.Established() {
			warn = strings.TrimPrefix(warn+"; "+n.LastError, "; ")
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

var bgpRoutesCmd = view("/v1/bgp/routes", func(w *tabwriter.Writer, v []admin.BGPRoute, _ bool) {
	fmt.Fprintln(w, "PREFIX\tKIND\tOWNERS\tADVERTISED")
	for _, r := range v {
		kind := r.Kind
		if r.Drain {
			kind += " (draining)" // sent with GRACEFUL_SHUTDOWN
		}
		if r.Weight > 0 {
			kind += fmt.Sprintf(" weight %d", r.Weight)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%v\n", r.Prefix, kind, list(r.Owners), r.Advertised)
	}
})

var servicesCmd = view("/v1/services", func(w *tabwriter.Writer, v []services.Address, wide bool) {
	if wide {
		fmt.Fprintln(w, "SERVICE\tADDRESS\tSOURCE\tSTATE\tREASON\tENDPOINTS\tPOLICY\tROUTE")
	} else {
		fmt.Fprintln(w, "SERVICE\tADDRESS\tSOURCE\tSTATE\tREASON")
	}
	for _, a := range v {
		ip := a.IP.String()
		if a.Raw != "" {
			ip = a.Raw
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s", a.Service, ip, a.Source, a.State, dash(a.Reason))
		if wide {
			policy := "Cluster"
			if a.Local {
				policy = "Local"
			}
			route := "-"
			if a.Route.IsValid() {
				route = a.Route.String() // the address, or its pool's CIDR (aggregate)
			}
			fmt.Fprintf(w, "\t%d\t%s\t%s", a.Endpoints, policy, route)
		}
		fmt.Fprintln(w)
	}
})

// readyResult is what `ready -o json|yaml` prints.
type readyResult struct {
	Pod          string `json:"pod"`
	Ready        bool   `json:"ready"`
	Incarnations int    `json:"incarnations"`
}

// readyCmd reports a pod's readiness (standalone mode).
func readyCmd(ctx context.Context, o *options, args []string, out io.Writer) error {
	ns, name, ok := strings.Cut(args[0], "/")
	if !ok || ns == "" || name == "" {
		return usagef(nil, "ready: pod %q: want NAMESPACE/NAME", args[0])
	}
	r, err := strconv.ParseBool(args[1])
	if err != nil {
		return usagef(nil, "ready: %q: want true or false", args[1])
	}
	var resp struct{ Pods int }
	if err := admin.NewClient(o.socket).Post(ctx, "/v1/pods/readiness", admin.Readiness{ID: podmeta.ID{Namespace: ns, Name: name}, Ready: r}, &resp); err != nil {
		return err
	}
	return emit(out, o.format, readyResult{Pod: ns + "/" + name, Ready: r, Incarnations: resp.Pods}, func(w *tabwriter.Writer) {
		state := "NotReady"
		if r {
			state = "Ready"
		}
		fmt.Fprintf(w, "%s/%s: %s (%d incarnation(s))\n", ns, name, state, resp.Pods)
	})
}

// errPolicyNotRunning means nothing answers on flock-policy's socket.
var errPolicyNotRunning = errors.New("flock-policy is not running")

// policyCmd shows the NetworkPolicies isolating the node's pods, or one pod's.
func policyCmd(ctx context.Context, o *options, args []string, out io.Writer) error {
	path := policyapi.PoliciesPath
	if len(args) == 1 {
		ns, name, ok := strings.Cut(args[0], "/")
		if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
			return usagef(nil, "policy: pod %q: want NAMESPACE/NAME", args[0])
		}
		path += "?" + url.Values{"pod": {args[0]}}.Encode()
	}
	var v []policyapi.PodView
	if err := admin.NewClient(o.policySocket).Get(ctx, path, &v); err != nil {
		if errors.Is(err, admin.ErrNotRunning) {
			return fmt.Errorf("%w (nothing answers on %s; is the flock DaemonSet's policy container running, and is this the right --policy-socket?)", errPolicyNotRunning, o.policySocket)
		}
		return err
	}
	return emit(out, o.format, v, func(w *tabwriter.Writer) {
		if o.wide() {
			fmt.Fprintln(w, "POD\tNODE\tIPS\tINGRESS\tEGRESS")
		} else {
			fmt.Fprintln(w, "POD\tIPS\tINGRESS\tEGRESS")
		}
		for _, p := range v {
			if o.wide() {
				fmt.Fprintf(w, "%s/%s\t%s\t%s\t%s\t%s\n", p.Namespace, p.Name, dash(p.Node), list(p.IPs), list(p.Ingress), list(p.Egress))
				continue
			}
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

// emit prints v as JSON or YAML, else (table, wide) as the table.
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

// timestamp is t in RFC 3339 (UTC), "-" for none.
func timestamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// ago is how long ago t was, "-" for never.
func ago(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return time.Since(t).Round(time.Second).String() + " ago"
}
