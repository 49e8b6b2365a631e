package bgp

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	api "github.com/osrg/gobgp/v4/api"

	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

func families(p *api.Peer) []string {
	var out []string
	for _, af := range p.AfiSafis {
		f := af.Config.Family
		switch {
		case f.Afi == api.Family_AFI_IP && f.Safi == api.Family_SAFI_UNICAST:
			out = append(out, "ipv4")
		case f.Afi == api.Family_AFI_IP6 && f.Safi == api.Family_SAFI_UNICAST:
			out = append(out, "ipv6")
		default:
			out = append(out, f.String())
		}
	}
	return out
}

func TestKey(t *testing.T) {
	tests := []struct {
		peer v1alpha1.Peer
		want string
	}{
		{v1alpha1.Peer{Address: "fd00:0:1:0::1"}, "fd00:0:1::1"},
		{v1alpha1.Peer{Address: "192.0.2.1"}, "192.0.2.1"},
		{v1alpha1.Peer{Interface: "eth1"}, "interface eth1"},
		{v1alpha1.Peer{Interface: "eth1", Address: "fe80::1"}, "interface eth1"},
		{v1alpha1.Peer{Address: "not-an-ip"}, "not-an-ip"},
	}
	for _, tt := range tests {
		if got := Key(tt.peer); got != tt.want {
			t.Errorf("Key(%+v) = %q, want %q", tt.peer, got, tt.want)
		}
	}
}

func TestFamiliesAndTransport(t *testing.T) {
	tests := []struct {
		name   string
		peer   v1alpha1.Peer
		v6     bool
		want   []string
		apiFam []string
	}{
		{"IPv6 address", v1alpha1.Peer{Address: "fd00::1"}, true, []string{"ipv4", "ipv6"}, []string{"ipv4", "ipv6"}},
		{"interface", v1alpha1.Peer{Interface: "eth0"}, true, []string{"ipv4", "ipv6"}, []string{"ipv4", "ipv6"}},
		{"IPv4 address", v1alpha1.Peer{Address: "192.0.2.1"}, false, []string{"ipv4"}, []string{"ipv4"}},
		{"explicit, sorted and deduplicated", v1alpha1.Peer{Address: "fd00::1", Families: []string{"ipv6", "ipv4", "ipv6"}}, true, []string{"ipv4", "ipv6"}, []string{"ipv4", "ipv6"}},
		{"explicit IPv6 only", v1alpha1.Peer{Address: "fd00::1", Families: []string{"ipv6"}}, true, []string{"ipv6"}, []string{"ipv6"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := TransportV6(tt.peer); got != tt.v6 {
				t.Errorf("TransportV6 = %v, want %v", got, tt.v6)
			}
			if got := Families(tt.peer); !slices.Equal(got, tt.want) {
				t.Errorf("Families = %v, want %v", got, tt.want)
			}
			if got := families(apiPeer(tt.peer, "", false, false)); !slices.Equal(got, tt.apiFam) {
				t.Errorf("apiPeer families = %v, want %v", got, tt.apiFam)
			}
		})
	}
	// Families must not reorder the caller's slice.
	in := []string{"ipv6", "ipv4"}
	Families(v1alpha1.Peer{Families: in})
	if !slices.Equal(in, []string{"ipv6", "ipv4"}) {
		t.Errorf("Families modified its input: %v", in)
	}
}

func TestAPIPeerDefaults(t *testing.T) {
	p := apiPeer(v1alpha1.Peer{Address: "fd00:0:1::2", ASN: 64513}, "", true, false)
	if p.Conf.PeerAsn != 64513 || !p.Conf.AdminDown || p.Conf.AuthPassword != "" {
		t.Errorf("conf = %+v", p.Conf)
	}
	if p.Conf.NeighborAddress != "fd00:0:1::2" || p.Conf.NeighborInterface != "" {
		t.Errorf("neighbour = %q / %q", p.Conf.NeighborAddress, p.Conf.NeighborInterface)
	}
	tc := p.Timers.Config
	if tc.HoldTime != 90 || tc.KeepaliveInterval != 30 || tc.ConnectRetry != 5 {
		t.Errorf("timers = hold %d keepalive %d retry %d, want 90/30/5", tc.HoldTime, tc.KeepaliveInterval, tc.ConnectRetry)
	}
	if p.Transport.RemotePort != 0 || p.Transport.LocalAddress != "" {
		t.Errorf("transport = %+v", p.Transport)
	}
	gr := p.GracefulRestart
	if gr == nil || !gr.Enabled || gr.RestartTime != 120 || gr.DeferralTime != 60 || gr.LocalRestarting {
		t.Errorf("graceful restart = %+v, want enabled 120/60, not restarting", gr)
	}
	if len(p.AfiSafis) != 2 {
		t.Fatalf("%d families, want 2", len(p.AfiSafis))
	}
	for _, af := range p.AfiSafis {
		if !af.Config.Enabled {
			t.Errorf("family %v not enabled", af.Config.Family)
		}
		if af.MpGracefulRestart == nil || !af.MpGracefulRestart.Config.Enabled {
			t.Errorf("family %v: MpGracefulRestart not enabled", af.Config.Family)
		}
		if af.PrefixLimits != nil {
			t.Errorf("family %v: prefix limit %+v without MaxPrefixes", af.Config.Family, af.PrefixLimits)
		}
	}
	if p.Bfd != nil || p.EbgpMultihop != nil || p.TtlSecurity != nil {
		t.Errorf("bfd %+v multihop %+v ttl %+v, want none", p.Bfd, p.EbgpMultihop, p.TtlSecurity)
	}
	if !strings.Contains(p.Conf.Description, "fd00:0:1::2") {
		t.Errorf("description %q", p.Conf.Description)
	}
	if apiPeer(v1alpha1.Peer{Address: "fd00::1"}, "", false, false).Conf.AdminDown {
		t.Error("adminDown=false gives an admin-down peer")
	}
	if gr := apiPeer(v1alpha1.Peer{Address: "fd00::1"}, "", true, true).GracefulRestart; gr == nil || !gr.LocalRestarting {
		t.Errorf("restarting: graceful restart = %+v, want LocalRestarting", gr)
	}
	if gr := apiPeer(v1alpha1.Peer{Address: "fd00::1", GracefulRestart: v1alpha1.GracefulRestart{Disabled: true}}, "", true, true).GracefulRestart; gr != nil && (gr.Enabled || gr.LocalRestarting) {
		t.Errorf("restarting with GR disabled: graceful restart = %+v", gr)
	}
}

func TestAPIPeerKnobs(t *testing.T) {
	tests := []struct {
		name  string
		peer  v1alpha1.Peer
		check func(t *testing.T, p *api.Peer)
	}{
		{
			name: "timers, keepalive a third of the hold time",
			peer: v1alpha1.Peer{Address: "fd00::1", Timers: v1alpha1.Timers{HoldTime: 9}},
			check: func(t *testing.T, p *api.Peer) {
				if c := p.Timers.Config; c.HoldTime != 9 || c.KeepaliveInterval != 3 || c.ConnectRetry != 5 {
					t.Errorf("timers %+v", c)
				}
			},
		},
		{
			name: "timers explicit",
			peer: v1alpha1.Peer{Address: "fd00::1", Timers: v1alpha1.Timers{HoldTime: 30, KeepaliveTime: 5, ConnectRetry: 1}},
			check: func(t *testing.T, p *api.Peer) {
				if c := p.Timers.Config; c.HoldTime != 30 || c.KeepaliveInterval != 5 || c.ConnectRetry != 1 {
					t.Errorf("timers %+v", c)
				}
			},
		},
		{
			name: "graceful restart times",
			peer: v1alpha1.Peer{Address: "fd00::1", GracefulRestart: v1alpha1.GracefulRestart{RestartTime: 30, DeferralTime: 10}},
			check: func(t *testing.T, p *api.Peer) {
				if gr := p.GracefulRestart; gr == nil || !gr.Enabled || gr.RestartTime != 30 || gr.DeferralTime != 10 {
					t.Errorf("graceful restart %+v", gr)
				}
			},
		},
		{
			name: "graceful restart disabled",
			peer: v1alpha1.Peer{Address: "fd00::1", GracefulRestart: v1alpha1.GracefulRestart{Disabled: true}},
			check: func(t *testing.T, p *api.Peer) {
				if gr := p.GracefulRestart; gr != nil && gr.Enabled {
					t.Errorf("graceful restart %+v, want off", gr)
				}
				for _, af := range p.AfiSafis {
					if af.MpGracefulRestart != nil && af.MpGracefulRestart.Config.Enabled {
						t.Errorf("family %v: MpGracefulRestart on", af.Config.Family)
					}
				}
			},
		},
		{
			// flock runs BFD itself (bfd.go): GoBGP's never comes on.
			name: "BFD is not GoBGP's",
			peer: v1alpha1.Peer{Address: "fd00::1", BFD: v1alpha1.BFD{Enabled: true, IntervalMs: 50, Multiplier: 5}},
			check: func(t *testing.T, p *api.Peer) {
				if p.Bfd != nil && p.Bfd.Enabled {
					t.Errorf("GoBGP BFD %+v, want off", p.Bfd)
				}
			},
		},
		{
			name: "multihop",
			peer: v1alpha1.Peer{Address: "fd00::1", EBGPMultihop: 4},
			check: func(t *testing.T, p *api.Peer) {
				if m := p.EbgpMultihop; m == nil || !m.Enabled || m.MultihopTtl != 4 {
					t.Errorf("multihop %+v", m)
				}
			},
		},
		{
			name: "TTL security",
			peer: v1alpha1.Peer{Address: "fd00::1", TTLSecurityMin: 255},
			check: func(t *testing.T, p *api.Peer) {
				if s := p.TtlSecurity; s == nil || !s.Enabled || s.TtlMin != 255 {
					t.Errorf("ttl security %+v", s)
				}
			},
		},
		{
			name: "max prefixes on every family",
			peer: v1alpha1.Peer{Address: "fd00::1", MaxPrefixes: 1000},
			check: func(t *testing.T, p *api.Peer) {
				if len(p.AfiSafis) != 2 {
					t.Fatalf("%d families", len(p.AfiSafis))
				}
				for _, af := range p.AfiSafis {
					l := af.PrefixLimits
					if l == nil || l.MaxPrefixes != 1000 || l.Family.Afi != af.Config.Family.Afi || l.Family.Safi != af.Config.Family.Safi {
						t.Errorf("family %v: prefix limit %+v", af.Config.Family, l)
					}
				}
			},
		},
		{
			name: "interface peer",
			peer: v1alpha1.Peer{Interface: "eth1", ASN: 64513},
			check: func(t *testing.T, p *api.Peer) {
				if p.Conf.NeighborInterface != "eth1" || p.Conf.NeighborAddress != "" {
					t.Errorf("neighbour address %q interface %q", p.Conf.NeighborAddress, p.Conf.NeighborInterface)
				}
				if got := families(p); !slices.Equal(got, []string{"ipv4", "ipv6"}) {
					t.Errorf("families %v", got)
				}
			},
		},
		{
			name: "IPv4 peer, port, local address, password",
			peer: v1alpha1.Peer{Address: "192.0.2.1", Port: 1179, LocalAddress: "192.0.2.2"},
			check: func(t *testing.T, p *api.Peer) {
				if p.Conf.NeighborAddress != "192.0.2.1" || p.Transport.RemotePort != 1179 || p.Transport.LocalAddress != "192.0.2.2" {
					t.Errorf("conf %+v transport %+v", p.Conf, p.Transport)
				}
				if p.Conf.AuthPassword != "s3cret" {
					t.Errorf("password %q", p.Conf.AuthPassword)
				}
				if got := families(p); !slices.Equal(got, []string{"ipv4"}) {
					t.Errorf("families %v", got)
				}
			},
		},
		{
			name: "non-canonical address is normalised",
			peer: v1alpha1.Peer{Address: "FD00:0:0::1"},
			check: func(t *testing.T, p *api.Peer) {
				if p.Conf.NeighborAddress != "fd00::1" {
					t.Errorf("neighbour %q", p.Conf.NeighborAddress)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.check(t, apiPeer(tt.peer, "s3cret", false, false))
		})
	}
}

func TestSessionFingerprint(t *testing.T) {
	base := v1alpha1.Peer{Address: "fd00::1", ASN: 64513, Timers: v1alpha1.Timers{HoldTime: 9}}
	fp := sessionFingerprint(base, "pw")

	comm := base
	comm.Communities = v1alpha1.KindCommunities{Pod: []string{"64512:100"}}
	comm.LargeCommunities = v1alpha1.KindCommunities{Anycast: []string{"64512:1:2"}}
	if sessionFingerprint(comm, "pw") != fp {
		t.Error("communities change the session fingerprint")
	}
	// Clearing communities must not touch the caller's peer.
	if len(comm.Communities.Pod) != 1 || len(comm.LargeCommunities.Anycast) != 1 {
		t.Error("sessionFingerprint modified its argument")
	}

	changed := map[string]func(p *v1alpha1.Peer){
		"hold time":     func(p *v1alpha1.Peer) { p.Timers.HoldTime = 30 },
		"keepalive":     func(p *v1alpha1.Peer) { p.Timers.KeepaliveTime = 1 },
		"connect retry": func(p *v1alpha1.Peer) { p.Timers.ConnectRetry = 1 },
		"ASN":           func(p *v1alpha1.Peer) { p.ASN = 64514 },
		"port":          func(p *v1alpha1.Peer) { p.Port = 1179 },
		"local address": func(p *v1alpha1.Peer) { p.LocalAddress = "fd00::2" },
		"GR":            func(p *v1alpha1.Peer) { p.GracefulRestart.Disabled = true },
		"families":      func(p *v1alpha1.Peer) { p.Families = []string{"ipv6"} },
		"max prefixes":  func(p *v1alpha1.Peer) { p.MaxPrefixes = 10 },
		"password file": func(p *v1alpha1.Peer) { p.PasswordFile = "/x" },
	}
	for name, mut := range changed {
		q := base
		mut(&q)
		if sessionFingerprint(q, "pw") == fp {
			t.Errorf("%s change does not change the fingerprint", name)
		}
	}
	// BFD changes apply live, without a BGP reset.
	for name, mut := range map[string]func(p *v1alpha1.Peer){
		"BFD enabled":  func(p *v1alpha1.Peer) { p.BFD.Enabled = true },
		"BFD interval": func(p *v1alpha1.Peer) { p.BFD.IntervalMs = 50 },
	} {
		q := base
		mut(&q)
		if sessionFingerprint(q, "pw") != fp {
			t.Errorf("%s change changes the fingerprint (would reset the BGP session)", name)
		}
	}
	if sessionFingerprint(base, "other") == fp {
		t.Error("password change does not change the fingerprint")
	}
	if fp := sessionFingerprint(base, "s3cret-pw"); strings.Contains(fp, "s3cret-pw") {
		t.Errorf("the fingerprint holds the password: %s", fp)
	}
}

func TestFilePasswords(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name    string
		file    string
		want    string
		wantErr []string // substrings of the error
	}{
		{name: "no file configured", file: "", want: ""},
		{name: "plain", file: write("plain", "s3cret"), want: "s3cret"},
		{name: "trailing newline trimmed", file: write("nl", "s3cret\n"), want: "s3cret"},
		{name: "CRLF trimmed", file: write("crlf", "s3cret\r\n\n"), want: "s3cret"},
		{name: "inner spaces kept", file: write("spaces", "two words\n"), want: "two words"},
		{name: "missing file", file: filepath.Join(dir, "missing"), wantErr: []string{"fd00::1", filepath.Join(dir, "missing")}},
		{name: "empty file", file: write("empty", ""), wantErr: []string{"fd00::1", "empty"}},
		{name: "only a newline", file: write("newline", "\n"), wantErr: []string{"fd00::1", "empty"}},
		{name: "too long", file: write("long", strings.Repeat("x", 81)), wantErr: []string{"fd00::1", "80"}},
		{name: "80 bytes is fine", file: write("eighty", strings.Repeat("x", 80)+"\n"), want: strings.Repeat("x", 80)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &Speaker{passwords: FilePasswords}
			got, err := s.password(v1alpha1.Peer{Address: "fd00::1", PasswordFile: tt.file})
			if len(tt.wantErr) > 0 {
				if err == nil {
					t.Fatalf("got %q, want an error", got)
				}
				for _, s := range tt.wantErr {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not mention %q", err, s)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("password %q, want %q", got, tt.want)
			}
		})
	}
}
