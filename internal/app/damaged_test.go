//go:build unix

package app

import (
	"bytes"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kdedup/kdedup/consumer"
)

// TestMoveAsideKeepsOnlyTheNewest: the gauge counts a damaged-* directory
// left by an earlier run at start-up; two successive moves leave exactly one
// damaged-* directory, holding exactly the second state, beside lost+found
// and foreign-states (other topics' states, untouched);
// after each move kdedup_damaged_state_bytes equals the blocks allocated
// under damaged-*, summed by walking the directory here.
func TestMoveAsideKeepsOnlyTheNewest(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, map[string]string{
		"damaged-20200101T000000.000Z/000001.vlog": strings.Repeat("o", 3000),
		"lost+found/kept":                          "fsck",
		"foreign-states/in/0/data/x.kds":           "another topic's state",
	})
	reg := prometheus.NewRegistry()
	d := newDamaged(dir, reg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	d.measure()
	if got, want := gauge(t, reg), walkedBytes(t, dir); got != want || want == 0 {
		t.Fatalf("at start-up kdedup_damaged_state_bytes = %v, want %v (walked, not 0)", got, want)
	}

	states := []map[string]string{
		{"000001.vlog": strings.Repeat("a", 5000), "MANIFEST": "first", "KEYREGISTRY": "k"},
		{"000002.vlog": strings.Repeat("b", 70000), "000003.sst": strings.Repeat("c", 9000), "MANIFEST": "second", "import/marker": "m"},
	}
	last := -1.0
	for i, state := range states {
		write(t, dir, state)
		aside, err := d.moveAside()
		if err != nil {
			t.Fatalf("move %d: %v", i+1, err)
		}
		names := entryNames(t, dir)
		if len(names) != 3 || names[0] != filepath.Base(aside) || names[1] != consumer.ForeignStatesDir || names[2] != "lost+found" || !strings.HasPrefix(names[0], damagedPrefix) {
			t.Fatalf("after move %d the data directory holds %v, want [%s %s lost+found]", i+1, names, filepath.Base(aside), consumer.ForeignStatesDir)
		}
		if got := read(t, aside); !maps.Equal(got, state) {
			t.Errorf("after move %d %s holds %v, want state %d: %v", i+1, filepath.Base(aside), keys(got), i+1, keys(state))
		}
		got, want := gauge(t, reg), walkedBytes(t, dir)
		if got != want || got == last {
			t.Errorf("after move %d kdedup_damaged_state_bytes = %v, want %v (walked; before the move %v)", i+1, got, want, last)
		}
		last = got
	}
	if got := read(t, filepath.Join(dir, "lost+found")); !maps.Equal(got, map[string]string{"kept": "fsck"}) {
		t.Errorf("lost+found holds %v after the moves, want it untouched", got)
	}
	if got := read(t, filepath.Join(dir, consumer.ForeignStatesDir)); !maps.Equal(got, map[string]string{"in/0/data/x.kds": "another topic's state"}) {
		t.Errorf("%s holds %v after the moves, want it untouched: other topics' states are not the damaged state", consumer.ForeignStatesDir, got)
	}
}

// write creates each file of files (slash-separated paths under dir) with
// its content.
func write(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// read returns every regular file under dir, by slash-separated path, with
// its content.
func read(t *testing.T, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if err != nil || de.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		files[filepath.ToSlash(rel)] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func entryNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func keys(m map[string]string) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

// walkedBytes sums st_blocks*512 of every file and directory under the
// damaged-* entries of dir, as du does.
func walkedBytes(t *testing.T, dir string) float64 {
	t.Helper()
	matches, err := filepath.Glob(filepath.Join(dir, damagedPrefix+"*"))
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, m := range matches {
		err := filepath.Walk(m, func(p string, fi os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			var st syscall.Stat_t
			if err := syscall.Lstat(p, &st); err != nil {
				return err
			}
			n += st.Blocks * 512
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return float64(n)
}

// gauge is the value of kdedup_damaged_state_bytes gathered from reg.
func gauge(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "kdedup_damaged_state_bytes" {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	var names bytes.Buffer
	for _, mf := range mfs {
		names.WriteString(mf.GetName() + " ")
	}
	t.Fatalf("kdedup_damaged_state_bytes not registered; got %s", names.String())
	return 0
}
