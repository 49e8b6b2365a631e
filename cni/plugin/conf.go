package plugin

import (
	"errors"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"code.fritzlab.net/fritzlab/flock/cni/agentsock"
	"code.fritzlab.net/fritzlab/flock/cni/internal/jsonlite"
)

// SupportedVersions are the CNI spec versions the plugin speaks; VERSION
// reports them, and a network config in any other is refused.
var SupportedVersions = []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"}

// implementedVersion is the newest of them, VERSION's own cniVersion.
const implementedVersion = "1.1.0"

// env is the CNI environment of one call.
type env struct {
	command, containerID, netns, ifName, args, path, netnsOverride string
}

// envVar is one CNI variable: which commands need it, and how its value
// is checked. The table, its order and the error codes follow the CNI
// library's skel, so runtimes see the codes they saw from it.
type envVar struct {
	name     string
	val      func(*env) *string
	required string // the commands that need it, space-separated
	check    func(name, v string) *cniError
}

var envVars = []envVar{
	{"CNI_COMMAND", func(e *env) *string { return &e.command }, "ADD CHECK DEL GC STATUS", nil},
	{"CNI_CONTAINERID", func(e *env) *string { return &e.containerID }, "ADD CHECK DEL", checkContainerID},
	{"CNI_NETNS", func(e *env) *string { return &e.netns }, "ADD CHECK", nil},
	{"CNI_IFNAME", func(e *env) *string { return &e.ifName }, "ADD CHECK DEL", checkIfName},
	{"CNI_ARGS", func(e *env) *string { return &e.args }, "", nil},
	{"CNI_PATH", func(e *env) *string { return &e.path }, "ADD CHECK DEL GC STATUS", nil},
	{"CNI_NETNS_OVERRIDE", func(e *env) *string { return &e.netnsOverride }, "", nil},
}

func needs(required, command string) bool {
	for _, c := range strings.Fields(required) {
		if c == command {
			return true
		}
	}
	return false
}

// readEnv reads the CNI variables; an empty one counts as missing.
func readEnv(getenv func(string) string) (env, *cniError) {
	var e env
	var missing []string
	for _, v := range envVars {
		p := v.val(&e)
		*p = getenv(v.name)
		req := needs(v.required, e.command) || v.name == "CNI_COMMAND"
		switch {
		case *p == "" && req:
			missing = append(missing, v.name)
		case *p != "" && req && v.check != nil:
			if err := v.check(v.name, *p); err != nil {
				return e, err
			}
		}
	}
	if len(missing) > 0 {
		return e, newError(errInvalidEnvironmentVariables,
			"flock: CNI_COMMAND "+quote(e.command)+" needs these environment variables, missing or empty: "+strings.Join(missing, ", "), "")
	}
	return e, nil
}

// validName is the CNI library's rule for container IDs and network
// names: a letter or digit, then letters, digits, '_', '.' or '-'.
func validName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
		if !alnum && (i == 0 || c != '_' && c != '.' && c != '-') {
			return false
		}
	}
	return s != ""
}

const nameRule = "only letters, digits, '_', '.' and '-', starting with a letter or digit"

func checkContainerID(name, v string) *cniError {
	if !validName(v) {
		return newError(errInvalidEnvironmentVariables, "flock: "+name+" "+quote(v)+": "+nameRule, "")
	}
	return nil
}

// maxIfName is the kernel's limit (IFNAMSIZ less the terminating NUL).
const maxIfName = 15

func checkIfName(name, v string) *cniError {
	bad := func(why string) *cniError {
		return newError(errInvalidEnvironmentVariables, "flock: "+name+" "+quote(v)+": "+why, "")
	}
	switch {
	case len(v) > maxIfName:
		return bad("longer than " + strconv.Itoa(maxIfName) + " bytes")
	case v == "." || v == "..":
		return bad("not a valid interface name")
	}
	for _, r := range v {
		if r == '/' || r == ':' || unicode.IsSpace(r) {
			return bad("holds '/', ':' or white space")
		}
	}
	return nil
}

// netConf is what the plugin reads of the network config; the agent gets
// all of it.
type netConf struct {
	cniVersion string
	name       string
	// socket is the agent's CNI socket (default agentsock.DefaultPath).
	socket string
	// timeoutSeconds bounds one request to the agent (default 30).
	timeoutSeconds int
	// typeErrs are the first wrong-typed value of each field, reported
	// where the CNI library's skel and then the plugin read that field.
	typeErrs map[string]*cniError
}

// confFields are the config's members the plugin reads, matched as
// encoding/json matches a struct's fields (exactly or, failing that,
// case-insensitively; the last of repeated keys wins, and a value of the
// wrong type is an error even when a later one is right).
var confFields = []struct {
	key string
	set func(c *netConf, raw []byte) error
}{
	{"cniVersion", func(c *netConf, raw []byte) error { return setString(&c.cniVersion, raw) }},
	{"name", func(c *netConf, raw []byte) error { return setString(&c.name, raw) }},
	{"socket", func(c *netConf, raw []byte) error { return setString(&c.socket, raw) }},
	{"timeoutSeconds", func(c *netConf, raw []byte) error { return setInt(&c.timeoutSeconds, raw) }},
}

var (
	errWantString = errors.New("want a string")
	errWantInt    = errors.New("want a whole number")
)

func setString(dst *string, raw []byte) error {
	switch jsonlite.Kind(raw) {
	case "null":
		return nil
	case "string":
		s, err := jsonlite.Unquote(raw)
		*dst = s
		return err
	}
	return errWantString
}

func setInt(dst *int, raw []byte) error {
	if jsonlite.Kind(raw) == "null" {
		return nil
	}
	if jsonlite.Kind(raw) != "number" {
		return errWantInt
	}
	n, err := strconv.Atoi(string(raw))
	if err != nil {
		return errWantInt
	}
	*dst = n
	return nil
}

// excerpt shortens a config value for an error message.
func excerpt(raw []byte) string {
	const max = 64
	if len(raw) <= max {
		return string(raw)
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(raw[cut]) {
		cut--
	}
	return string(raw[:cut]) + "…"
}

// decodeConf reads the config's fields and checks them as the CNI
// library's skel did (JSON, then the network name), and the plugin's own.
func decodeConf(stdin []byte) (netConf, *cniError) {
	var c netConf
	members, err := jsonlite.Object(stdin)
	if err != nil {
		return c, newError(errDecodingFailure, "flock: the network config on stdin is not a JSON object: "+err.Error(), "")
	}
	for _, m := range members {
		for _, f := range confFields {
			if m.Key != f.key && !strings.EqualFold(m.Key, f.key) {
				continue
			}
			if err := f.set(&c, m.Value); err != nil && c.typeErrs[f.key] == nil {
				if c.typeErrs == nil {
					c.typeErrs = map[string]*cniError{}
				}
				c.typeErrs[f.key] = newError(errDecodingFailure, "flock: network config field "+f.key+": "+err.Error()+", got "+excerpt(m.Value), "")
			}
		}
	}
	switch {
	case c.typeErrs["name"] != nil:
		return c, c.typeErrs["name"]
	case c.name == "":
		return c, newError(errInvalidNetworkConfig, "flock: network config field name is missing or empty", "")
	case !validName(c.name):
		return c, newError(errInvalidNetworkConfig, "flock: network config field name "+quote(c.name)+": "+nameRule, "")
	}
	return c, nil
}

// check is the plugin's own rule on its fields, after the version check.
func (c *netConf) check() *cniError {
	for _, f := range []string{"socket", "timeoutSeconds"} {
		if err := c.typeErrs[f]; err != nil {
			return err
		}
	}
	if c.timeoutSeconds < 0 {
		return newError(errInvalidNetworkConfig, "flock: network config field timeoutSeconds "+strconv.Itoa(c.timeoutSeconds)+": must not be negative", "")
	}
	if c.timeoutSeconds == 0 {
		c.timeoutSeconds = 30
	}
	if c.socket == "" {
		c.socket = agentsock.DefaultPath
	}
	return nil
}

// version is the config's cniVersion; none means 0.1.0 (the CNI spec).
func (c *netConf) version() string {
	if c.cniVersion == "" {
		return "0.1.0"
	}
	return c.cniVersion
}

// minVersion is the oldest spec version that has each command.
var minVersion = map[string]string{"CHECK": "0.4.0", "GC": "1.1.0", "STATUS": "1.1.0"}

// checkVersion refuses a config whose spec version this plugin does not
// speak, or that does not have the command.
func (c *netConf) checkVersion(command string) *cniError {
	if err := c.typeErrs["cniVersion"]; err != nil {
		return err
	}
	v := c.version()
	if min, ok := minVersion[command]; ok {
		older, err := versionLess(v, min)
		if err != nil {
			return newError(errDecodingFailure, "flock: network config field cniVersion "+quote(v)+": "+err.Error(), "")
		}
		if older {
			return newError(errIncompatibleCNIVersion, "flock: network config field cniVersion "+quote(v)+": "+command+" needs "+min+" or later", "")
		}
	}
	for _, s := range SupportedVersions {
		if v == s {
			return nil
		}
	}
	return newError(errIncompatibleCNIVersion, "flock: network config field cniVersion "+quote(v)+": this plugin speaks "+strings.Join(SupportedVersions, ", "), "")
}

// parseVersion reads MAJOR[.MINOR[.MICRO]] as the CNI library does.
func parseVersion(v string) ([3]int, error) {
	var n [3]int
	parts := strings.Split(v, ".")
	if len(parts) > 3 {
		return n, errors.New("not a version: too many parts")
	}
	for i, p := range parts {
		x, err := strconv.Atoi(p)
		if err != nil {
			return n, errors.New("not a version: " + quote(p) + " is not a number")
		}
		n[i] = x
	}
	return n, nil
}

func versionLess(a, b string) (bool, error) {
	x, err := parseVersion(a)
	if err != nil {
		return false, err
	}
	y, err := parseVersion(b)
	if err != nil {
		return false, err
	}
	for i := range x {
		if x[i] != y[i] {
			return x[i] < y[i], nil
		}
	}
	return false, nil
}
