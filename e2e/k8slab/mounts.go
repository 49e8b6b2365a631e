package k8slab

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// mountPoints returns the mount points that are under one of the prefixes
// (a prefix matches itself and what is below it), deepest first.
func mountPoints(prefixes []string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		for _, p := range prefixes {
			if mp == p || strings.HasPrefix(mp, strings.TrimSuffix(p, "/")+"/") {
				out = append(out, mp)
				break
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, nil
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space, ...).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountAll lazily unmounts every mount under prefixes, deepest first, and
// repeats for mounts stacked on the same point. Prefixes that are not
// absolute, or are "/", are ignored: they would take the whole host.
func unmountAll(prefixes []string) error {
	var safe []string
	for _, p := range prefixes {
		if p = filepath.Clean(p); filepath.IsAbs(p) && p != "/" {
			safe = append(safe, p)
		}
	}
	if len(safe) == 0 {
		return nil
	}
	prefixes = safe
	var errs []error
	for range 5 {
		mps, err := mountPoints(prefixes)
		if err != nil {
			return err
		}
		if len(mps) == 0 {
			return nil
		}
		errs = errs[:0]
		for _, mp := range mps {
			if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("unmount %s: %w", mp, err))
			}
		}
	}
	if mps, _ := mountPoints(prefixes); len(mps) > 0 {
		errs = append(errs, fmt.Errorf("still mounted: %s", strings.Join(mps, " ")))
	}
	return errors.Join(errs...)
}
