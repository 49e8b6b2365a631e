// Package hostinfo names where and at what commit a report's figures were
// taken (make bench, make scale).
package hostinfo

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
)

// Command is name's output, trimmed; "unknown" if it fails.
func Command(name string, args ...string) string {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// Machine describes where the figures were taken.
func Machine() string {
	cpu := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int
		fmt.Sscanf(strings.TrimPrefix(firstLine(string(b)), "MemTotal:"), "%d", &kb)
		mem = fmt.Sprintf(", %.0f GiB", float64(kb)/(1<<20))
	}
	return fmt.Sprintf("%d cores (%s)%s, kernel %s", runtime.NumCPU(), cpu, mem, Command("uname", "-r"))
}

// Revision is the commit measured, "-dirty" if tracked files other than
// the report itself differ from it.
func Revision(report string) string {
	rev := Command("git", "describe", "--always")
	if out, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)"+report).Output(); err != nil || len(out) > 0 {
		rev += "-dirty"
	}
	return rev
}
