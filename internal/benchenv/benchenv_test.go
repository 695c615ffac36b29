package benchenv

import (
	"encoding/binary"
	"encoding/hex"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestKeyIsABijectionOfTheCounter(t *testing.T) {
	seen := map[string]uint64{}
	var k [16]byte
	for i := range uint64(100_000) {
		Key(k[:], i)
		raw, err := hex.DecodeString(string(k[:]))
		if err != nil || len(raw) != 8 {
			t.Fatalf("key %q of %d is not 16 hexadecimal characters", k, i)
		}
		if j, ok := seen[string(k[:])]; ok {
			t.Fatalf("records %d and %d share key %q", j, i, k)
		}
		seen[string(k[:])] = i
		if binary.BigEndian.Uint64(raw) == i {
			t.Fatalf("key of %d is the counter itself", i)
		}
	}
}

func TestIntAndGathered(t *testing.T) {
	t.Setenv("KDEDUP_BENCHENV_TEST", "42")
	if got := Int(t, "KDEDUP_BENCHENV_TEST", 7); got != 42 {
		t.Fatalf("Int = %d, want 42", got)
	}
	if got := Int(t, "KDEDUP_BENCHENV_UNSET", 7); got != 7 {
		t.Fatalf("Int of an unset variable = %d, want the default 7", got)
	}
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x_total", Help: "x"}, []string{"l"})
	reg.MustRegister(c)
	c.WithLabelValues("a").Add(2)
	c.WithLabelValues("b").Add(3)
	if got := Gathered(t, reg, "x_total"); got != 5 {
		t.Fatalf("Gathered = %v, want 5", got)
	}
	if PeakRSS() == 0 {
		t.Fatal("PeakRSS is 0")
	}
	if CPU(t) <= 0 {
		t.Fatal("no CPU time used")
	}
}

// TestImportsNoKdedupPackage: benchenv is imported by the store's and the
// filter's benchmarks, so its imports are in their binaries and in the
// peak resident memory they report. Importing config (and through it the
// consumer and franz-go) added 25 MiB to the store benchmarks' peaks; no
// kdedup package may come in through benchenv.
func TestImportsNoKdedupPackage(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out, err := exec.Command(goTool, "list", "-deps", "-f", "{{.ImportPath}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	const self = "github.com/kdedup/kdedup/internal/benchenv"
	seen := false
	for dep := range strings.FieldsSeq(string(out)) {
		if dep == self {
			seen = true
			continue
		}
		if strings.HasPrefix(dep, "github.com/kdedup/kdedup/") {
			t.Errorf("benchenv imports %s", dep)
		}
	}
	if !seen {
		t.Fatalf("go list did not list %s itself:\n%s", self, out)
	}
}
