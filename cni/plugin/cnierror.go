package plugin

import (
	"strconv"

	"code.fritzlab.net/fritzlab/flock/cni/internal/jsonlite"
)

// CNI error codes (the CNI spec's; github.com/containernetworking/cni/pkg/types
// names them, and a test checks these against it).
const (
	errIncompatibleCNIVersion      = 1
	errInvalidEnvironmentVariables = 4
	errIOFailure                   = 5
	errDecodingFailure             = 6
	errInvalidNetworkConfig        = 7
	errInvalidNetNS                = 8
	errTryAgainLater               = 11
	errPluginNotAvailable          = 50
	errInternal                    = 999
)

// cniError is a CNI error result: printed on stdout as
// {"code":N,"msg":"...","details":"..."} with exit status 1.
type cniError struct {
	code    uint
	msg     string
	details string
	raw     []byte // the agent's own error object, printed as it came
}

func (e *cniError) Error() string {
	if e.raw != nil {
		return string(e.raw)
	}
	if e.details == "" {
		return e.msg
	}
	return e.msg + "; " + e.details
}

func newError(code uint, msg, details string) *cniError {
	return &cniError{code: code, msg: msg, details: details}
}

// json is the error as the runtime reads it (the field names and order of
// the CNI library's types.Error).
func (e *cniError) json() []byte {
	if e.raw != nil {
		return append(e.raw, '\n')
	}
	b := append([]byte(`{"code":`), strconv.FormatUint(uint64(e.code), 10)...)
	b = jsonlite.AppendQuote(append(b, `,"msg":`...), e.msg)
	if e.details != "" {
		b = jsonlite.AppendQuote(append(b, `,"details":`...), e.details)
	}
	return append(b, '}', '\n')
}

// quote is s as a JSON string, for naming a value in a message.
func quote(s string) string { return string(jsonlite.AppendQuote(nil, s)) }
