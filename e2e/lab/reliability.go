package lab

// ReliabilityRow is one row of RELIABILITY.md: one fault, what the test
// did, how often, what survived and the figures measured. The e2e tests
// write rows as JSON lines (FLOCK_RELIABILITY_OUT); e2e/cmd/reliability
// renders them.
type ReliabilityRow struct {
	Section string `json:"section"`
	Fault   string `json:"fault"`
	ToR     string `json:"tor,omitempty"`
	Done    string `json:"done"`
	// Times is how often the run applied the fault (a crash storm's
	// rounds; 1 for a single fault), or the inputs a fuzz run executed.
	Times    int               `json:"times"`
	Survived string            `json:"survived"`
	Figures  map[string]string `json:"figures,omitempty"`
	Test     string            `json:"test"`
	// Status is empty (or "ok") for a row that ran to its end; "failed"
	// for a finding (a fuzz input that fails); "error" for a run that
	// ended on an error of its own (a build that failed, a tool's error):
	// neither reads as clean.
	Status string `json:"status,omitempty"`
}
