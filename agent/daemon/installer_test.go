package daemon

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"code.fritzlab.net/fritzlab/flock/agent/metrics"
	"code.fritzlab.net/fritzlab/flock/agent/status"
	"code.fritzlab.net/fritzlab/flock/cni/install/report"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

// runDaemon is a daemon with just its options and a logger.
func runDaemon(t *testing.T) *daemon {
	t.Helper()
	return &daemon{o: Options{CNISocket: filepath.Join(t.TempDir(), "cni.sock")}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// The installer's refusal keeps the agent from being Ready: /readyz
// answers 503 with it, the status snapshot's problems and the NodeConfig's
// Ready condition name it, and it is logged at Error.
func TestInstallerRefusalIsNotReady(t *testing.T) {
	const refusal = `installer: refused to write the CNI config: --cni-version "1.1.0": not supported by all of the chain: flock supports [0.3.1, 0.4.0, 1.0.0, 1.1.0]; portmap (/opt/cni/bin/portmap) supports [0.1.0, 0.2.0, 0.3.0, 0.3.1, 0.4.0, 1.0.0]`
	path := filepath.Join(t.TempDir(), "installer.json")
	if err := report.Write(path, report.Report{Error: refusal, ConflistPath: "/etc/cni/net.d/01-flock.conflist", Conflist: report.ConflistKept}); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	d := runDaemon(t)
	d.log = slog.New(slog.NewTextHandler(&logs, nil))
	d.installer = d.readInstaller(path)
	if !strings.Contains(d.installer, refusal) || !strings.Contains(d.installer, "01-flock.conflist: kept") {
		t.Fatalf("installer problem %q", d.installer)
	}
	if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "portmap") {
		t.Errorf("no Error log naming the refusal:\n%s", logs.String())
	}

	readyz := func(d *daemon) (int, string) {
		t.Helper()
		rec := httptest.NewRecorder()
		(&metrics.Server{Metrics: metrics.New(nil), Ready: d.readiness}).Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := readyz(d); code != http.StatusServiceUnavailable || !strings.Contains(body, "recovering allocations") {
		t.Errorf("recovering: readyz %d %q", code, body)
	}
	d.ready.Store(true)
	if code, body := readyz(d); code != http.StatusServiceUnavailable || !strings.Contains(body, "cni installer: "+refusal) {
		t.Errorf("refused: readyz %d %q, want 503 with the refusal", code, body)
	}

	n := status.Node{Ready: true, Installer: d.installer}
	if p := n.Problems(); len(p) != 1 || !strings.HasPrefix(p[0], "cni installer: "+refusal) {
		t.Errorf("problems %q", p)
	}
	st := nodeStatus(n, 1)
	c := st.Conditions[0]
	if c.Type != v1alpha1.ConditionReady || c.Status != metav1.ConditionFalse || c.Reason != "InstallerRefused" || !strings.Contains(c.Message, refusal) {
		t.Errorf("condition %+v", c)
	}
	if !strings.Contains(st.LastError, refusal) {
		t.Errorf("lastError %q", st.LastError)
	}

	// An installer that installed, or none (standalone): Ready.
	for _, r := range []*report.Report{{CNIVersion: "1.0.0", Conflist: report.ConflistWritten}, nil} {
		path := filepath.Join(t.TempDir(), "installer.json")
		if r != nil {
			if err := report.Write(path, *r); err != nil {
				t.Fatal(err)
			}
		}
		d := runDaemon(t)
		d.ready.Store(true)
		if d.installer = d.readInstaller(path); d.installer != "" || d.readiness() != nil {
			t.Errorf("report %+v: problem %q, readiness %v", r, d.installer, d.readiness())
		}
		if code, body := readyz(d); code != http.StatusOK || body != "ok\n" {
			t.Errorf("report %+v: readyz %d %q, want 200", r, code, body)
		}
	}
	// One that cannot be read is no proof the installer succeeded.
	if err := os.WriteFile(path, []byte("{garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	if p := runDaemon(t).readInstaller(path); !strings.Contains(p, path) {
		t.Errorf("garbage report: problem %q, want it named", p)
	}
}

// A staged conflist goes into the conf dir when the agent serves, not
// before; one that cannot be published keeps the agent not Ready, naming
// it; an installer refusal publishes nothing.
func TestPublishConflist(t *testing.T) {
	stage, conf := t.TempDir(), filepath.Join(t.TempDir(), "net.d")
	staged := filepath.Join(stage, "01-flock.conflist")
	if err := os.WriteFile(staged, []byte(`{"cniVersion":"1.1.0"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "installer.json")
	if err := report.Write(path, report.Report{CNIVersion: "1.1.0", Conflist: report.ConflistStaged, Staged: staged, ConflistPath: "/etc/cni/net.d/01-flock.conflist"}); err != nil {
		t.Fatal(err)
	}
	d := runDaemon(t)
	d.o.CNIConfDir = conf
	d.installer = d.readInstaller(path)
	if _, err := os.Stat(filepath.Join(conf, "01-flock.conflist")); err == nil {
		t.Fatal("published before the agent serves")
	}
	d.publishConflist()
	d.ready.Store(true)
	if b, err := os.ReadFile(filepath.Join(conf, "01-flock.conflist")); err != nil || string(b) != `{"cniVersion":"1.1.0"}` {
		t.Fatalf("published %q, %v", b, err)
	}
	if err := d.readiness(); err != nil {
		t.Errorf("readiness after publishing: %v", err)
	}

	// The staged file gone (a wiped /run): not Ready, the error names it.
	d2 := runDaemon(t)
	d2.o.CNIConfDir, d2.staged = filepath.Join(t.TempDir(), "net.d"), filepath.Join(stage, "missing.conflist")
	d2.publishConflist()
	d2.ready.Store(true)
	if err := d2.readiness(); err == nil || !strings.Contains(err.Error(), "missing.conflist") {
		t.Errorf("readiness with nothing to publish: %v, want an error naming the staged file", err)
	}

	// A refusal: nothing is published.
	d3 := runDaemon(t)
	d3.o.CNIConfDir, d3.staged, d3.installer = filepath.Join(t.TempDir(), "net.d"), staged, "refused"
	d3.publishConflist()
	if _, err := os.Stat(filepath.Join(d3.o.CNIConfDir, "01-flock.conflist")); err == nil {
		t.Error("published despite the installer's refusal")
	}
}
