package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// saveProfile fetches one of the agent's Go profiles (heap, goroutine, …)
// from its admin socket into dir/name.pprof (`go tool pprof` reads it).
func saveProfile(adminSock, dir, name, profile string) error {
	if dir == "" {
		return nil
	}
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", adminSock)
		},
	}}
	q := "?gc=1"
	if strings.Contains(profile, "seconds=") { // a CPU profile, or a delta
		c.Timeout = 2 * time.Minute
		q = ""
	}
	resp, err := c.Get("http://agent/debug/pprof/" + profile + q)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("profile %s: %s: %s", profile, resp.Status, strings.TrimSpace(string(b)))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, name+".pprof"))
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	return err
}

// cpuProfile profiles the agent for d in the background; wait for the
// returned function before reading the profile.
func cpuProfile(adminSock, dir, name string, d time.Duration) (wait func()) {
	if dir == "" {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := saveProfile(adminSock, dir, name, fmt.Sprintf("profile?seconds=%d", int(d.Seconds()))); err != nil {
			logf("profile: %v", err)
		}
	}()
	// What the same time allocated, beside it.
	allocs := make(chan struct{})
	go func() {
		defer close(allocs)
		if err := saveProfile(adminSock, dir, strings.Replace(name, "cpu", "allocs", 1), fmt.Sprintf("allocs?seconds=%d", int(d.Seconds()))); err != nil {
			logf("profile: %v", err)
		}
	}()
	return func() { <-done; <-allocs }
}

// smaps is a process's resident memory split: anonymous (heap, stacks)
// and file-backed (the binary's pages).
func smaps(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 && (f[0] == "Rss:" || f[0] == "Anonymous:" || f[0] == "Pss_File:" || f[0] == "Pss_Anon:") {
			out = append(out, f[0]+" "+f[1]+" kB")
		}
	}
	return strings.Join(out, ", ")
}
