package netpol

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
)

func TestConfigErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "node name is empty"},
		{Config{NodeName: "n1", QueueID: -1}, "queue ID -1"},
		{Config{NodeName: "n1", QueueID: 70000}, "queue ID 70000"},
	} {
		err := tc.cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want an error naming %q", tc.cfg, err, tc.want)
		}
		// Run refuses the same config before it touches the API or the
		// kernel.
		err = Run(context.Background(), &rest.Config{Host: "https://192.0.2.1:1"}, tc.cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Run(%+v) = %v, want an error naming %q", tc.cfg, err, tc.want)
		}
	}
	if err := (Config{NodeName: "n1", QueueID: 100}).Validate(); err != nil {
		t.Errorf("a valid config: %v", err)
	}
}
