package bgp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	api "github.com/osrg/gobgp/v4/api"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"code.fritzlab.net/fritzlab/flock/advert"
	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

func secret(t *testing.T, prefix string) string {
	t.Helper()
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return prefix + hex.EncodeToString(b)
}

// setNeighborPassword re-creates the ToR's neighbour with a TCP-MD5
// password ("" for none).
func (r *tor) setNeighborPassword(t *testing.T, pw string) {
	t.Helper()
	var old *api.Peer
	if err := r.srv.ListPeer(context.Background(), &api.ListPeerRequest{Address: r.neighbor}, func(p *api.Peer) { old = p }); err != nil {
		t.Fatal(err)
	}
	if old != nil {
		if err := r.srv.DeletePeer(context.Background(), &api.DeletePeerRequest{Address: r.neighbor}); err != nil {
			t.Fatal(err)
		}
	}
	r.addNeighborConf(t, r.neighbor, flockASN, func(p *api.Peer) { p.Conf.AuthPassword = pw })
}

// leakCheck gathers everything the speaker shows or says.
type leakCheck struct {
	t       *testing.T
	sp      *Speaker
	logs    *logCapture
	mu      sync.Mutex
	shown   []string // Neighbors JSON, metrics, errors
	secrets []string
}

func (c *leakCheck) add(what, s string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.shown = append(c.shown, what+":\n"+s)
}

// snapshot records Neighbors() as JSON (what flockctl bgp neighbors and the
// NodeConfig status are built from) and the speaker's Prometheus metrics as
// a scrape renders them.
func (c *leakCheck) snapshot(when string) {
	t := c.t
	t.Helper()
	b, err := json.Marshal(c.sp.Neighbors(context.Background()))
	if err != nil {
		t.Fatal(err)
	}
	c.add("neighbors "+when, string(b))
	reg := prometheus.NewRegistry()
	reg.MustRegister(c.sp.Collector())
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	m, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	c.add("metrics "+when, string(m))
}

func (c *leakCheck) applyErr(when string, peers []v1alpha1.Peer) error {
	err := c.sp.ApplyPeers(peers)
	if err != nil {
		c.add("ApplyPeers error "+when, err.Error())
	}
	return err
}

func (c *leakCheck) verify() {
	t := c.t
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	all := append([]string{"log:\n" + c.logs.String()}, c.shown...)
	for _, text := range all {
		what, _, _ := strings.Cut(text, "\n")
		for _, s := range c.secrets {
			if i := strings.Index(text, s); i >= 0 {
				t.Errorf("password %q leaked in %s: …%s…", s, what, text[max(0, i-200):min(len(text), i+len(s)+50)])
			}
		}
	}
}

// Passwords (from a file and from a PasswordReader, as the Kubernetes
// Secret reader is) never appear in what the speaker logs — GoBGP's records
// included, at debug level — nor in Neighbors(), the Prometheus metrics or
// the errors ApplyPeers returns, through a peer's add, an established
// session, a wrong password, a password change, a max-prefix trip (the
// peer is re-added), unreadable password files and the peer's removal.
func TestPasswordsNeverLeak(t *testing.T) {
	shortMaxPrefixBackoff(t, 500*time.Millisecond, time.Second, time.Hour)
	dir := t.TempDir()
	filePW, filePW2 := secret(t, "file-pw-"), secret(t, "file-pw2-")
	readerPW, readerPW2, wrongPW := secret(t, "reader-pw-"), secret(t, "reader-pw2-"), secret(t, "wrong-pw-")
	multi1, multi2 := secret(t, "multi-a-"), secret(t, "multi-b-")
	long := secret(t, "long-") + strings.Repeat("x", MaxPasswordLen)
	pwFile := filepath.Join(dir, "tor-a.md5")
	write := func(path, content string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(pwFile, filePW+"\n")
	multiFile, longFile := filepath.Join(dir, "multi.md5"), filepath.Join(dir, "long.md5")
	write(multiFile, multi1+"\n"+multi2+"\n")
	write(longFile, long)

	var readerMu sync.Mutex
	current := readerPW
	passwords := func(p v1alpha1.Peer) ([]byte, string, error) {
		if p.PasswordSecretKey != "" {
			readerMu.Lock()
			defer readerMu.Unlock()
			return []byte(current), "the reader", nil
		}
		return FilePasswords(p)
	}
	setReader := func(pw string) {
		readerMu.Lock()
		current = pw
		readerMu.Unlock()
	}

	rA := startToR(t, "::1", torASN, "10.255.0.1")
	rA.neighbor = "::1"
	rA.setNeighborPassword(t, filePW)
	rB := startToR(t, "127.0.0.1", tor2ASN, "10.255.0.3")
	rB.neighbor = "127.0.0.1"
	rB.setNeighborPassword(t, readerPW)

	log, logs := captureLogger(t)
	sp := newSpeaker(t, func(c *Config) { c.Log = log; c.Passwords = passwords; c.BGP.ImportPolicy = "accept" })
	// GoBGP at debug too: nothing it could log may hold a password.
	if err := sp.srv.SetLogLevel(context.Background(), &api.SetLogLevelRequest{Level: api.SetLogLevelRequest_LEVEL_DEBUG}); err != nil {
		t.Fatal(err)
	}
	c := &leakCheck{t: t, sp: sp, logs: logs, secrets: []string{filePW, filePW2, readerPW, readerPW2, wrongPW, multi1, multi2, long}}
	set(t, sp, map[netip.Prefix]advert.Kind{pod6: advert.Pod, pod4: advert.Pod}, true)

	pA := torPeer(rA)
	pA.PasswordFile, pA.MaxPrefixes = pwFile, 3
	pB := torPeer(rB)
	pB.PasswordSecretKey = "tor-b"
	c.snapshot("before")

	// Add: both sessions come up, so TCP-MD5 is in use.
	if err := c.applyErr("add", []v1alpha1.Peer{pA, pB}); err != nil {
		t.Fatal(err)
	}
	c.snapshot("adding")
	waitEstablished(t, sp, rA, "::1")
	waitEstablished(t, sp, rB, "127.0.0.1")
	c.snapshot("established")

	// Failure: a wrong password (the ToR never answers).
	setReader(wrongPW)
	if err := c.applyErr("wrong password", []v1alpha1.Peer{pA, pB}); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyWithin(t, waitFor, "session with the wrong password down", func() (bool, string) {
		n := mustNeighbor(t, sp, "127.0.0.1")
		return !n.Established() && !rB.established(t), string(n.State)
	})
	testutil.Consistently(t, "no session with the wrong password", 2*time.Second, func() (bool, string) {
		return !rB.established(t), "ToR established"
	})
	c.snapshot("wrong password")

	// Change: both passwords (file and reader) change at the ToRs and here.
	setReader(readerPW2)
	rB.setNeighborPassword(t, readerPW2)
	write(pwFile, filePW2+"\n")
	rA.setNeighborPassword(t, filePW2)
	upA := rA.uptime(t)
	if err := c.applyErr("change", []v1alpha1.Peer{pA, pB}); err != nil {
		t.Fatal(err)
	}
	c.snapshot("changing")
	waitEstablished(t, sp, rB, "127.0.0.1")
	testutil.EventuallyWithin(t, waitFor, "file password peer re-created", func() (bool, string) {
		n := mustNeighbor(t, sp, "::1")
		return n.Established() && rA.established(t) && rA.uptime(t).After(upA), string(n.State)
	})
	c.snapshot("changed")

	// Failure: max-prefix (the peer is deleted and added again).
	flood := torPrefixes(5)
	rA.announce(t, flood...)
	testutil.EventuallyWithin(t, waitFor, "max-prefix trip", func() (bool, string) {
		n := mustNeighbor(t, sp, "::1")
		return strings.HasPrefix(n.LastError, "max-prefix 3 exceeded"), fmt.Sprintf("%+v", n)
	})
	c.snapshot("max-prefix")
	rA.withdraw(t, flood...)
	testutil.EventuallyWithin(t, waitFor, "back after max-prefix", func() (bool, string) {
		n := mustNeighbor(t, sp, "::1")
		return n.Established() && n.LastError == "", fmt.Sprintf("%+v", n)
	})
	c.snapshot("after max-prefix")

	// Unreadable password files: the errors name the peer and the file,
	// never what is in it; the running sessions are kept.
	for _, bad := range []struct{ name, file string }{
		{"missing", filepath.Join(dir, "missing.md5")},
		{"directory", dir},
		{"multi-line", multiFile},
		{"too long", longFile},
	} {
		q := pA
		q.PasswordFile = bad.file
		err := c.applyErr(bad.name, []v1alpha1.Peer{q, pB})
		if err == nil || !strings.Contains(err.Error(), "peer ::1: passwordFile") {
			t.Errorf("%s: error %v", bad.name, err)
		}
		c.snapshot(bad.name)
	}
	if n := mustNeighbor(t, sp, "::1"); !n.Established() {
		t.Errorf("session dropped for an unreadable password file: %+v", n)
	}

	// Remove.
	if err := c.applyErr("remove", nil); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyWithin(t, waitFor, "peers removed", func() (bool, string) {
		got := gobgpPeers(t, sp)
		return len(got) == 0, fmt.Sprint(got)
	})
	c.snapshot("removed")

	// The capture saw what it had to: flock's lines and GoBGP's debug ones.
	for _, want := range [][]string{{"bgp: peer added"}, {"bgp: peer removed"}, {"bgp: max-prefix exceeded"}, {"component=gobgp", "level=DEBUG"}} {
		if len(logs.lines(want...)) == 0 {
			t.Errorf("no log line with %q", want)
		}
	}
	c.mu.Lock()
	if !strings.Contains(strings.Join(c.shown, "\n"), "bgp_peer_state") {
		t.Error("no BGP metrics gathered")
	}
	c.mu.Unlock()
	c.verify()
}
