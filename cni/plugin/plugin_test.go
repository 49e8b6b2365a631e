package plugin

import (
	"errors"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"code.fritzlab.net/fritzlab/flock/cni/wire"
)

func TestParseConf(t *testing.T) {
	c, err := parseConf([]byte(`{"cniVersion":"1.1.0","name":"n","type":"flock"}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Socket != wire.DefaultSocket || c.TimeoutSeconds != 30 {
		t.Errorf("defaults: socket %q timeout %d", c.Socket, c.TimeoutSeconds)
	}
	c, err = parseConf([]byte(`{"cniVersion":"1.1.0","name":"n","type":"flock","socket":"/tmp/x.sock","timeoutSeconds":5}`))
	if err != nil || c.Socket != "/tmp/x.sock" || c.TimeoutSeconds != 5 {
		t.Errorf("explicit: %+v %v", c, err)
	}
	for _, bad := range []struct{ in, want string }{
		{`{not json`, "not valid JSON"},
		{`{"cniVersion":"1.1.0","name":"n","type":"flock","timeoutSeconds":-1}`, "timeoutSeconds -1"},
	} {
		_, err := parseConf([]byte(bad.in))
		var te *types.Error
		if !errors.As(err, &te) || !strings.Contains(te.Msg, bad.want) {
			t.Errorf("%s: want error containing %q, got %v", bad.in, bad.want, err)
		}
	}
}
