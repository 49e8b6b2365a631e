package agent

import (
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/types"

	"code.fritzlab.net/fritzlab/flock/agent/annotations"
	"code.fritzlab.net/fritzlab/flock/agent/nodestate"
	"code.fritzlab.net/fritzlab/flock/agent/store"
	"code.fritzlab.net/fritzlab/flock/dataplane"
	"code.fritzlab.net/fritzlab/flock/ipam"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

// CNI error codes the agent answers with.
const (
	codeUnknownContainer = types.ErrUnknownContainer
	codeEnv              = types.ErrInvalidEnvironmentVariables
	codeConfig           = types.ErrInvalidNetworkConfig
	codeNetns            = types.ErrInvalidNetNS
	codeTryAgain         = types.ErrTryAgainLater
	codeNotAvailable     = types.ErrPluginNotAvailable
	codeInternal         = types.ErrInternal
)

// Error carries an explicit CNI error code.
type Error struct {
	Code uint
	Err  error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// ToCNI maps an error to a CNI error: the code tells the runtime what kind
// of failure it is, the message tells a person what to fix.
func ToCNI(err error) *types.Error {
	if err == nil {
		return nil
	}
	code := codeInternal
	var ce *Error
	var ae *annotations.Error
	var me *podmeta.MissingArgError
	var ne *dataplane.NetnsError
	var cf *nodestate.ConflictError
	var ae2 *AuthError
	var cl *ClaimError
	switch {
	case errors.As(err, &ce):
		code = ce.Code
	case errors.As(err, &ae), errors.As(err, &cf), errors.As(err, &ae2), errors.As(err, &cl):
		code = codeConfig
	case errors.As(err, &me):
		code = codeEnv
	case errors.As(err, &ne):
		code = codeNetns
	case errors.Is(err, ipam.ErrExhausted):
		code = codeTryAgain
	case errors.Is(err, ipam.ErrNotInPool), errors.Is(err, ipam.ErrForbidden), errors.Is(err, ipam.ErrBadAlgo):
		code = codeConfig
	}
	return &types.Error{Code: code, Msg: "flock: " + err.Error()}
}

// validateContainerID applies the one container-ID rule (the store's: the
// ID names the record file) and maps a violation to a CNI error.
func validateContainerID(id string) error {
	if id == "" {
		return &Error{Code: codeUnknownContainer, Err: errors.New("CNI_CONTAINERID is empty")}
	}
	if err := store.ValidateContainerID(id); err != nil {
		return &Error{Code: codeEnv, Err: fmt.Errorf("CNI_CONTAINERID: %w", err)}
	}
	return nil
}

func validateAttachment(id, netns, ifName string) error {
	if err := validateContainerID(id); err != nil {
		return err
	}
	if netns == "" {
		return &Error{Code: codeEnv, Err: errors.New("CNI_NETNS is empty")}
	}
	if ifName == "" || len(ifName) > 15 {
		return &Error{Code: codeEnv, Err: fmt.Errorf("CNI_IFNAME %q: want 1 to 15 characters", ifName)}
	}
	return nil
}
