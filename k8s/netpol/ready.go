package netpol

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

// nfqueueProc lists the NFQUEUEs some process has bound, one a line, the
// queue number first (proc(5)). A queue leaves it when its reader closes.
const nfqueueProc = "/proc/net/netfilter/nfnetlink_queue"

// Ready is nil while the engine enforces on this node: its nftables table
// (inet flock-netpol) exists and a process reads NFQUEUE queueID. Else it
// says, in one line, what is missing. Both are needed: without the table
// no packet is queued, without a reader the queued ones are dropped (or,
// fail-open, pass unchecked).
func Ready(queueID int) error {
	return ready(queueID, tableExists, nfqueueProc)
}

func ready(queueID int, table func() error, proc string) error {
	if err := table(); err != nil {
		return err
	}
	f, err := os.Open(proc)
	if errors.Is(err, fs.ErrNotExist) {
		// The file comes with the nfnetlink_queue module, which the first
		// reader loads.
		return fmt.Errorf("no process reads NFQUEUE %d (%s does not exist)", queueID, proc)
	}
	if err != nil {
		return fmt.Errorf("read bound NFQUEUEs: %w", err)
	}
	defer f.Close()
	bound, err := boundQueues(f)
	if err != nil {
		return fmt.Errorf("read bound NFQUEUEs: %s: %w", proc, err)
	}
	if !bound[queueID] {
		return fmt.Errorf("no process reads NFQUEUE %d yet", queueID)
	}
	return nil
}

// boundQueues parses /proc/net/netfilter/nfnetlink_queue: the first
// column of each line is a bound queue's number.
func boundQueues(r io.Reader) (map[int]bool, error) {
	bound := map[int]bool{}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		q, err := strconv.Atoi(fields[0])
		if err != nil {
			return nil, fmt.Errorf("line %d: queue number %q: %w", n, fields[0], err)
		}
		bound[q] = true
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return bound, nil
}

// tableExists is nil if the engine's table is in the kernel.
func tableExists() error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("open nftables: %w", err)
	}
	if _, err := c.ListTableOfFamily(Table, nftables.TableFamilyINet); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("nftables table inet %s does not exist yet", Table)
		}
		return fmt.Errorf("list nftables table inet %s: %w", Table, err)
	}
	return nil
}
