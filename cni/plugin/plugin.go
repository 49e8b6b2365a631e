// Package plugin is the flock CNI plugin: a thin client that forwards each
// CNI op to the node agent over its unix socket and prints what comes back.
// It holds no state, so it can be exec'd concurrently without locking.
//
// The runtime execs it once per pod, so what it links is start-up time on
// every ADD: it reads and writes its JSON with cni/internal/jsonlite and
// its socket with system calls, and checks the CNI environment and config
// itself, with the CNI library's rules and error codes (its skel package
// is the oracle in this package's tests).
package plugin

import (
	"errors"
	"io"
	"os"
	"strings"
	"syscall"
	"time"

	"code.fritzlab.net/fritzlab/flock/cni/agentsock"
	"code.fritzlab.net/fritzlab/flock/cni/internal/jsonlite"
)

const about = "flock: pure-L3 IPv6-first CNI (forwards to flock-agent)"

// Timeouts of STATUS: runtimes poll it every few seconds and wait for it.
// During a planned restart (a fresh restart marker) the new agent may hold
// the call in its socket's backlog while it recovers: the node stays
// Ready meanwhile, so STATUS need not wait long to learn nothing new.
const (
	statusTimeout           = 5 * time.Second
	restartingStatusTimeout = time.Second
)

// Main is the plugin's entry point; it returns the exit status.
func Main() int {
	return Run(os.Getenv, os.Stdin, os.Stdout, os.Stderr)
}

// Run is one invocation: the CNI environment from getenv, the network
// config on stdin, the result or error on stdout. It returns the exit
// status (0, or 1 with a CNI error printed).
func Run(getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) int {
	out, err := run(getenv, stdin, stderr)
	if err != nil {
		stdout.Write(err.json())
		return 1
	}
	if out != nil {
		if _, werr := stdout.Write(out); werr != nil {
			return 1
		}
	}
	return 0
}

func run(getenv func(string) string, stdin io.Reader, stderr io.Writer) ([]byte, *cniError) {
	e, cerr := readEnv(getenv)
	if cerr != nil {
		if e.command == "" {
			// Run by hand: say what this is.
			io.WriteString(stderr, about+"\nCNI protocol versions supported: "+strings.Join(SupportedVersions, ", ")+"\n")
			return nil, nil
		}
		return nil, cerr
	}
	if e.command == "VERSION" {
		return versionJSON(), nil
	}
	in, err := io.ReadAll(stdin)
	if err != nil {
		return nil, newError(errIOFailure, "flock: reading the network config from stdin: "+err.Error(), "")
	}
	conf, cerr := decodeConf(in)
	if cerr != nil {
		return nil, cerr
	}
	switch e.command {
	case "ADD", "DEL", "CHECK", "GC", "STATUS":
	default:
		return nil, newError(errInvalidEnvironmentVariables, "flock: CNI_COMMAND "+quote(e.command)+": want ADD, DEL, CHECK, GC, STATUS or VERSION", "")
	}
	if cerr := conf.checkVersion(e.command); cerr != nil {
		return nil, cerr
	}
	if cerr := conf.check(); cerr != nil {
		return nil, cerr
	}
	req := request{op: e.command, containerID: e.containerID, netns: e.netns, ifName: e.ifName, args: e.args, config: in}
	switch e.command {
	case "ADD":
		if cerr := checkNotOwnNetns(e); cerr != nil {
			return nil, cerr
		}
		return add(&conf, req)
	case "DEL":
		if cerr := del(&conf, req); cerr != nil {
			return nil, cerr
		}
		// The CNI library's order: the DEL is done, then this is told.
		return nil, checkNotOwnNetns(e)
	case "STATUS":
		return nil, status(&conf, req)
	default: // CHECK, GC
		_, cerr := ask(&conf, req, conf.timeout())
		return nil, cerr
	}
}

// versionJSON is VERSION's answer, as the CNI library's version package
// encodes it.
func versionJSON() []byte {
	b := jsonlite.AppendQuote([]byte(`{"cniVersion":`), implementedVersion)
	b = append(b, `,"supportedVersions":[`...)
	for i, v := range SupportedVersions {
		if i > 0 {
			b = append(b, ',')
		}
		b = jsonlite.AppendQuote(b, v)
	}
	return append(b, ']', '}', '\n')
}

func (c *netConf) timeout() time.Duration { return time.Duration(c.timeoutSeconds) * time.Second }

// exchange sends req and reads the agent's response. An error means the
// agent gave no readable answer.
func exchange(conf *netConf, req request, timeout time.Duration) (response, error) {
	frame, err := call(conf.socket, req.frame(), min(2*time.Second, timeout), timeout)
	if err != nil {
		return response{}, err
	}
	return parseResponse(frame)
}

// ask sends req and returns the agent's result (nil when it sent none),
// the agent's CNI error as it came, or the error of a call it did not
// answer.
func ask(conf *netConf, req request, timeout time.Duration) ([]byte, *cniError) {
	resp, err := exchange(conf, req, timeout)
	if err != nil {
		return nil, unanswered(conf, req.op, err)
	}
	if resp.err != nil {
		return nil, &cniError{raw: resp.err}
	}
	return resp.result, nil
}

// unanswered is the CNI error for a request the agent did not answer:
// code 11 (try again later) while it restarts or is not running.
func unanswered(conf *netConf, op string, err error) *cniError {
	if r, ok := agentsock.Restarting(conf.socket, time.Now()); ok {
		return newError(errTryAgainLater, "flock: the flock agent is restarting (a planned stop, expected back by "+
			r.Until.UTC().Format(time.RFC3339)+"; socket "+conf.socket+"): try again", err.Error())
	}
	if errors.Is(err, errAgentNotRunning) {
		return newError(errTryAgainLater, "flock: the flock agent is not running (socket "+conf.socket+")", err.Error())
	}
	return newError(errIOFailure, "flock: "+op+" via "+conf.socket+" failed", err.Error())
}

// add forwards ADD and prints the result, which the agent writes in the
// config's spec version.
func add(conf *netConf, req request) ([]byte, *cniError) {
	res, cerr := ask(conf, req, conf.timeout())
	if cerr != nil {
		return nil, cerr
	}
	if res == nil {
		return nil, newError(errDecodingFailure, "flock: the agent answered ADD without a result", "")
	}
	var got string
	if members, err := jsonlite.Object(res); err == nil {
		for _, m := range members {
			if m.Key == "cniVersion" {
				got, _ = jsonlite.Unquote(m.Value)
			}
		}
	}
	if got != conf.version() {
		// An agent older than this plugin: the pod is set up, the
		// runtime's DEL after this error takes it down again.
		return nil, newError(errIncompatibleCNIVersion, "flock: the agent answered ADD in CNI version "+quote(got)+
			", the network config asks for "+quote(conf.version())+": the agent is older than this plugin; upgrade it", "")
	}
	return append(res, '\n'), nil
}

// del forwards DEL. With no agent to answer, a DEL of a sandbox whose
// network namespace is gone succeeds: after a reboot the runtime tears
// the dead sandboxes down before the agent (a pod itself) is back, and
// nothing is left to do here — the veth went with the namespace, and the
// agent reaps the allocation when it starts (its namespace is gone),
// giving back its addresses and claims. Any other unanswered DEL fails,
// for the runtime to retry.
func del(conf *netConf, req request) *cniError {
	resp, err := exchange(conf, req, conf.timeout())
	switch {
	case err != nil && errors.Is(err, errAgentNotRunning) && netnsGone(req.netns):
		return nil
	case err != nil:
		return unanswered(conf, req.op, err)
	case resp.err != nil:
		return &cniError{raw: resp.err}
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
		return err == syscall.ENOENT
	}
	return st.Type != nsfsMagic
}

// checkNotOwnNetns refuses CNI_NETNS when it is the plugin's own network
// namespace (the host's), unless CNI_NETNS_OVERRIDE says it is meant: the
// CNI library's rule, checked before the ADD rather than after it.
func checkNotOwnNetns(e env) *cniError {
	if o := strings.ToUpper(e.netnsOverride); o == "TRUE" || o == "1" {
		return nil
	}
	var target, own syscall.Stat_t
	if e.netns == "" || syscall.Stat(e.netns, &target) != nil {
		return nil // the agent says what is wrong with it
	}
	if err := syscall.Stat("/proc/thread-self/ns/net", &own); err != nil {
		return newError(errInvalidNetNS, "flock: reading the plugin's own network namespace: "+err.Error(), "")
	}
	if target.Dev == own.Dev && target.Ino == own.Ino {
		return newError(errInvalidNetNS, "flock: CNI_NETNS "+quote(e.netns)+" is the plugin's own network namespace (the host's)", "")
	}
	return nil
}

// status asks the agent whether it can take ADDs. While a planned
// restart is under way (a fresh restart marker) and the agent does not
// answer, it succeeds: the runtime keeps the node Ready through a
// rollout. A crash leaves no marker, and STATUS fails.
func status(conf *netConf, req request) *cniError {
	timeout := statusTimeout
	_, restarting := agentsock.Restarting(conf.socket, time.Now())
	if restarting {
		timeout = restartingStatusTimeout
	}
	resp, err := exchange(conf, req, timeout)
	switch {
	case err == nil && resp.err != nil:
		return &cniError{raw: resp.err}
	case err == nil:
		return nil
	case restarting:
		return nil
	}
	cerr := unanswered(conf, req.op, err)
	if cerr.code == errTryAgainLater {
		// STATUS has its own code for "cannot serve ADD now".
		cerr.code = errPluginNotAvailable
	}
	return cerr
}
