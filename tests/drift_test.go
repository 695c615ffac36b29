package tests

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/kdedup/kdedup/internal/scenario"
)

// TestChangedParamsRefused: a worker's state is written with the filter
// parameters and the key spec of its configuration; a start with any one
// of the variables that set them changed exits with code 1 and an error
// naming that variable, the stored and the configured value, and the two
// ways out. The refusals change nothing: the original configuration then
// resumes on the same state and the output is exactly the model's.
// The state is written with a window (so that WINDOW_GENERATIONS counts)
// longer than the stream, and widths derived from a 1e-9 target rate (so
// that TARGET_FPR counts; they reach 32 bits, as the other suites' fixed
// widths do).
func TestChangedParamsRefused(t *testing.T) {
	p := newPipeline(t, 2)
	p.window = scenario.ExpectOptions{Window: 1000 * time.Hour, Generations: 8}
	p.extraEnv = map[string]string{"KDEDUP_FINGERPRINT_BITS": "0", "KDEDUP_TARGET_FPR": "1e-9"}
	recs := stream(31)
	dir := filepath.Join(t.TempDir(), "state")
	p.feed(t, recs[:len(recs)/2], len(recs)/2, 0).wait(t)
	w := p.startWorker(t, dir)
	p.output(t, recs[:len(recs)/2])
	w.stop(t)

	for _, tc := range []struct {
		variable, value    string
		stored, configured string // as the text log quotes them
	}{
		{"KDEDUP_KEY", "header:id", `\"key\"`, `\"header:id\"`},
		{"KDEDUP_WINDOW", "2000h", "1000h0m0s", "2000h0m0s"},
		{"KDEDUP_WINDOW_GENERATIONS", "4", "8", "4"},
		{"KDEDUP_CAPACITY", "4000", "2000", "4000"},
		{"KDEDUP_TARGET_FPR", "1e-8", "1e-09", "1e-08"},
		{"KDEDUP_FINGERPRINT_BITS", "16", "0", "16"},
		{"KDEDUP_BUCKET_SIZE", "8", "4", "8"},
		{"KDEDUP_MAX_KICKS", "100", "500", "100"},
		{"KDEDUP_EXPANSION", "4", "2", "4"},
		{"KDEDUP_PAGE_BYTES", "8KiB", "4096", "8192"},
	} {
		t.Run(tc.variable, func(t *testing.T) {
			pr := p.startProcess(t, dir, tc.variable+"="+tc.value)
			pr.requireStoppedWith(t, 1,
				"stored state was written with other parameters: "+tc.variable+" stored "+tc.stored+", configured "+tc.configured+
					" (restore the stored value, or move the data directory aside to rebuild the state by replay under the configured value)")
		})
	}

	p.feed(t, recs[len(recs)/2:], len(recs)/2, 0).wait(t)
	w = p.startWorker(t, dir)
	wantOut, got := p.output(t, recs)
	w.stop(t)
	requireExact(t, wantOut, got)
}
