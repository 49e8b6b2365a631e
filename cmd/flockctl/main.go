// Command flockctl is the operator CLI: it reads the agent's admin socket
// (and, for `policy`, flock-policy's).
//
// Conventions (every flock binary): --help, -h (and here `flockctl help
// [COMMAND]`) print the usage to stdout and exit 0; --version prints
// "flockctl VERSION (commit REV, GOVERSION)" and exits 0; a usage error (an
// unknown command, flag or argument, a bad -o) names the bad thing on
// stderr and exits 2; any other failure (the agent not answering, an API
// error) exits 1. Flags go before or after the command: `flockctl -o json
// status` is `flockctl status -o json`. Every command takes -o table, wide,
// json or yaml.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"code.fritzlab.net/fritzlab/flock/agent/admin"
	"code.fritzlab.net/fritzlab/flock/cmd/internal/buildinfo"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/policyapi"
)

// Exit statuses.
const (
	exitOK    = 0
	exitFail  = 1 // the command failed: the agent did not answer, refused, …
	exitUsage = 2 // the command line is wrong
)

// formats are -o's values; table is the default, wide a table with more
// columns.
var formats = []string{"table", "wide", "json", "yaml"}

func main() {
	os.Exit(cli(os.Args[1:], os.Stdout, os.Stderr))
}

// cli runs flockctl and returns its exit status; errors go to stderr.
func cli(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "check-probe" {
		return probeMain(args[1:], stderr)
	}
	err := run(args, stdout)
	if err == nil {
		return exitOK
	}
	fmt.Fprintln(stderr, "flockctl:", err)
	var ue *usageError
	if !errors.As(err, &ue) {
		return exitFail
	}
	if ue.usage != "" {
		fmt.Fprint(stderr, "\n"+ue.usage)
	} else {
		fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", ue.cmd.path())
	}
	return exitUsage
}

// usageError is a wrong command line: exit status 2, with a pointer to the
// help of the command it was for (or that help itself).
type usageError struct {
	err   error
	cmd   *command
	usage string // printed in full after the error; "" points to --help
}

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usagef(c *command, format string, a ...any) error {
	return &usageError{err: fmt.Errorf(format, a...), cmd: c}
}

// options are the flags every command takes.
type options struct {
	socket       string
	policySocket string
	format       string
	version      bool
	// check's: the cluster, the probes' image, each wait's bound.
	kubeconfig   string
	image        string
	checkTimeout time.Duration
}

// wide tells whether -o wide asked for the extra columns.
func (o *options) wide() bool { return o.format == "wide" }

// A command is a group of subcommands (subs) or one that runs (run).
type command struct {
	name    string   // as typed: "neighbors"
	aliases []string // other spellings of name
	args    string   // synopsis of its arguments: "NAMESPACE/NAME true|false"
	summary string   // for the list of commands; a second line is indented
	about   string   // for its help, after the summary
	wide    string   // what -o wide adds
	nargs   [2]int   // least and most arguments
	// long: the command bounds its own time (the others get 10 s).
	long   bool
	run    func(ctx context.Context, o *options, args []string, out io.Writer) error
	subs   []*command
	parent *command
}

// tree is flockctl's commands.
func tree() *command {
	root := &command{name: "flockctl", subs: []*command{
		{name: "status", run: statusCmd,
			summary: "agent health: recovery, sessions, route reconcilers (errors, last error), reaped allocations",
			wide:    "the problems the agent reports (PROBLEM rows), and per reconciler the state generation its last pass applied and its last success"},
		{name: "bgp", summary: "the embedded BGP speaker: its sessions and the paths the node originates", subs: []*command{
			{name: "neighbors", aliases: []string{"neighbours", "neighbor"}, run: neighborsCmd,
				summary: "BGP sessions: state, uptime, families, prefix counts, BFD, GR, warnings",
				wide:    "the resolved peer address, the last state change, BFD in detail (remote state and C-bit, failures/planned downs, last diagnostic), the RFC 5549 guard, and the last error even while established"},
			{name: "routes", run: bgpRoutesCmd,
				summary: "paths the node originates: prefix, kind, owning pods, advertised",
				wide:    "nothing: the table has every field (-o json has the same)"},
		}},
		{name: "services", aliases: []string{"svc"}, run: servicesCmd,
			summary: "Service addresses (LoadBalancer and external IPs): advertised, draining or not,\nand why (no local ready endpoint, none anywhere, not authorized, class not ours)",
			wide:    "the endpoints this node's kube-proxy delivers to and the traffic policy"},
		{name: "pods", run: podsCmd,
			summary: "attachments: container, pod, phase, readiness, interface, veth, IPs",
			wide:    "the full container ID, the pod's UID (static pods: their static UID) and the creation time"},
		{name: "ipam", run: ipamCmd,
			summary: "pools with used, held and free addresses",
			wide:    "the pool's namespace selector in a column of its own"},
		{name: "routes", run: routesCmd,
			summary: "anycast and addresses host routes: in the kernel and as wanted, with next hops",
			wide:    "the owning containers' full IDs"},
		{name: "ready", args: "NAMESPACE/NAME true|false", nargs: [2]int{2, 2}, run: readyCmd,
			summary: "standalone mode: report a pod Ready or NotReady (its anycast and addresses\nIPs are advertised and routed only while Ready)",
			about:   "It prints the outcome as \"NAMESPACE/NAME: Ready (N incarnation(s))\" (table and wide), or\n{pod, ready, incarnations} with -o json or yaml.",
			wide:    "nothing"},
		{name: "check", long: true, run: checkCmd,
			summary: "the cluster end to end (kubeconfig, not a node's sockets): pod to pod across\nnodes in each family, `addresses` and anycast IPs, BGP sessions and routes,\na LoadBalancer address, NetworkPolicy; exits 1 if a check fails",
			about:   "It runs probe pods (flockctl check-probe, from flock's image of flockctl's own release,\nor --image) on two nodes in a namespace of its own, flock-check-*, labelled\nflock.fritzlab.net/check, and removes it at the end; a check cut short is\ncleaned up by the next. `addresses`, anycast and LoadBalancer addresses are\nchecked where an AddressPool of that use selects namespaces labelled\nflock.fritzlab.net/check=true. It first asks the API for every right it uses\nand names the missing ones.",
			wide:    "the detail of the checks that passed too"},
		{name: "policy", args: "[NAMESPACE/NAME]", nargs: [2]int{0, 1}, run: policyCmd,
			summary: "NetworkPolicy (flock-policy): the node's pods, or the one named, with their IPs\nand the policies isolating their ingress and egress",
			about:   "It asks flock-policy's admin socket (--policy-socket), not the agent's.",
			wide:    "the node the pod runs on"},
	}}
	var link func(*command)
	link = func(c *command) {
		for _, s := range c.subs {
			s.parent = c
			link(s)
		}
	}
	link(root)
	return root
}

// path is the command as typed: "flockctl bgp neighbors".
func (c *command) path() string {
	if c.parent == nil {
		return c.name
	}
	return c.parent.path() + " " + c.name
}

// sub finds a subcommand by name or alias.
func (c *command) sub(name string) *command {
	for _, s := range c.subs {
		if s.name == name {
			return s
		}
		for _, a := range s.aliases {
			if a == name {
				return s
			}
		}
	}
	return nil
}

// flags is a command's flag set: the options every command takes.
func (c *command) flags(o *options) *flag.FlagSet {
	fs := flag.NewFlagSet(c.path(), flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are returned; help is printed by usage
	fs.Usage = func() {}
	fs.StringVar(&o.socket, "socket", admin.DefaultSocket, "agent admin socket")
	fs.StringVar(&o.policySocket, "policy-socket", policyapi.DefaultSocket, "flock-policy's admin socket (the policy command)")
	fs.StringVar(&o.format, "o", "table", "output `format`: "+orList(formats))
	fs.BoolVar(&o.version, "version", false, "print flockctl's version and exit")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "check: the cluster's kubeconfig (default $KUBECONFIG, ~/.kube/config, in-cluster)")
	fs.StringVar(&o.image, "image", "", "check: the probe pods' image (default flock's image of this flockctl's release)")
	fs.DurationVar(&o.checkTimeout, "timeout", 2*time.Minute, "check: how long each wait may take (a pod to run, an address)")
	return fs
}

// run runs the command line, writing its output (or help) to out; errors
// are returned, the wrong command lines among them as a *usageError.
func run(args []string, out io.Writer) error {
	root := tree()
	// One set of options, filled by every command's flag set in turn:
	// the flags go before or after the command words. A flag set sets
	// its defaults when its flags are defined, so each is made (and its
	// defaults applied) before the first parse.
	var o options
	sets := map[*command]*flag.FlagSet{}
	var mk func(*command)
	mk = func(c *command) {
		sets[c] = c.flags(&o)
		for _, s := range c.subs {
			mk(s)
		}
	}
	mk(root)

	c, rest := root, args
	var words []string // positional arguments of the command
	for {
		var err error
		if c.run != nil {
			words, err = parseInterspersed(sets[c], rest)
		} else {
			err = sets[c].Parse(rest)
			rest = sets[c].Args()
		}
		switch {
		case errors.Is(err, flag.ErrHelp):
			return c.help(out, sets[c])
		case err != nil:
			return &usageError{err: err, cmd: c}
		case o.version:
			_, err := fmt.Fprintln(out, buildinfo.Line("flockctl"))
			return err
		}
		if c.run != nil {
			break
		}
		if len(rest) == 0 {
			if c == root {
				var b strings.Builder
				_ = c.help(&b, sets[c])
				return &usageError{err: errors.New("no command given"), cmd: c, usage: b.String()}
			}
			// A group alone lists its commands, as `kubectl config` does.
			return c.help(out, sets[c])
		}
		if rest[0] == "help" {
			return helpCmd(c, sets, rest[1:], out)
		}
		next := c.sub(rest[0])
		if next == nil {
			return usagef(c, "unknown command %q for %q", rest[0], c.path())
		}
		c, rest = next, rest[1:]
	}

	if !slices.Contains(formats, o.format) {
		return usagef(c, "-o %q: want %s", o.format, orList(formats))
	}
	if len(words) < c.nargs[0] || len(words) > c.nargs[1] {
		if c.nargs[1] == 0 {
			return usagef(c, "%s: unexpected argument %q", strings.TrimPrefix(c.path(), "flockctl "), words[0])
		}
		return usagef(c, "usage: %s %s", c.path(), c.args)
	}
	timeout := 10 * time.Second
	if c.long {
		timeout = 24 * time.Hour
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err := c.run(ctx, &o, words, out)
	if ue := (*usageError)(nil); errors.As(err, &ue) && ue.cmd == nil {
		ue.cmd = c // a bad argument: point to this command's help
	}
	return err
}

// parseInterspersed parses flags before, between and after the positional
// arguments (which it returns); "--" ends the flags.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var words []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			return append(words, rest...), nil
		}
		if len(rest) == 0 {
			return words, nil
		}
		words, args = append(words, rest[0]), rest[1:]
	}
}

// helpCmd is `flockctl help [COMMAND]` (and `flockctl bgp help [COMMAND]`).
func helpCmd(c *command, sets map[*command]*flag.FlagSet, words []string, out io.Writer) error {
	for _, w := range words {
		next := c.sub(w)
		if next == nil {
			return usagef(c, "help: unknown command %q for %q", w, c.path())
		}
		c = next
	}
	return c.help(out, sets[c])
}

// help prints a command's usage: its synopsis, what it does, its
// subcommands, its flags.
func (c *command) help(out io.Writer, fs *flag.FlagSet) error {
	var b strings.Builder
	switch {
	case c.parent == nil:
		b.WriteString("usage: flockctl [flags] COMMAND [ARGS] [flags]\n\n")
		b.WriteString("flockctl reads the flock agent's admin socket (and, for policy, flock-policy's).\n")
		b.WriteString("Flags go before or after the command.\n")
	case c.run == nil:
		fmt.Fprintf(&b, "usage: %s COMMAND [flags]\n\n%s\n", c.path(), c.summary)
	default:
		fmt.Fprintf(&b, "usage: %s", c.path())
		if c.args != "" {
			b.WriteString(" " + c.args)
		}
		fmt.Fprintf(&b, " [flags]\n\n%s\n", strings.ReplaceAll(c.summary, "\n", " "))
		if c.about != "" {
			b.WriteString(c.about + "\n")
		}
		if len(c.aliases) > 0 {
			fmt.Fprintf(&b, "Aliases: %s.\n", strings.Join(c.aliases, ", "))
		}
		if c.wide != "" {
			fmt.Fprintf(&b, "-o wide adds %s.\n", c.wide)
		}
	}
	if len(c.subs) > 0 {
		b.WriteString("\ncommands:\n")
		var list func(*command, string)
		list = func(c *command, prefix string) {
			for _, s := range c.subs {
				if s.run == nil && c.parent == nil {
					list(s, prefix+s.name+" ")
					continue
				}
				name := prefix + s.name
				if s.args != "" {
					name += " " + s.args
				}
				fmt.Fprintf(&b, "  %-32s%s\n", name, strings.ReplaceAll(s.summary, "\n", "\n"+strings.Repeat(" ", 34)))
			}
		}
		list(c, "")
		if c.parent == nil {
			fmt.Fprintf(&b, "  %-32s%s\n", "help [COMMAND]", "this help, or a command's")
		}
	}
	b.WriteString("\nflags:\n")
	fs.SetOutput(&b)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
	if c.run == nil {
		fmt.Fprintf(&b, "\nRun '%s COMMAND --help' for a command's help.\n", c.path())
	}
	if c.parent == nil {
		b.WriteString("Exit status: 0 done (also --help, --version), 1 failed (the agent or flock-policy\n" +
			"did not answer, or refused), 2 a usage error (an unknown command, flag or argument).\n")
	}
	_, err := io.WriteString(out, b.String())
	return err
}

// orList reads "a, b, c or d".
func orList(s []string) string {
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}
