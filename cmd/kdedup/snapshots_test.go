package main

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/snapshot"
	"github.com/kdedup/kdedup/store"
)

// TestInspectSnapshots uploads a snapshot of every partition of the test
// state to a directory store and checks what `inspect -snapshots -verify
// -json` reports against the state's own metadata and Stats; then damages
// one object: that snapshot's verification fails, the command exits with
// errVerify, and the other stays "ok".
func TestInspectSnapshots(t *testing.T) {
	states := testState()
	dir := buildState(t, states)
	ref := readChains(t, dir)
	snapDir := t.TempDir()
	url := "file://" + snapDir
	root, err := snapshot.Open(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	st := root.In("orders-dedup")
	defer st.Close()
	db, err := store.Open(store.Options{Dir: dir, PageBytes: testPageBytes, ReadOnly: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	objects := map[store.TopicPartition]string{}
	for _, s := range states {
		m, err := st.Put(t.Context(), s.tp, func(h func(store.Image) error, p func(filter.PageID, []byte) error) (bool, error) {
			return db.Export(s.tp, h, p)
		})
		if err != nil {
			t.Fatal(err)
		}
		objects[s.tp] = filepath.Join(snapDir, "orders-dedup", filepath.FromSlash(m.Object))
	}
	db.Close()

	decode := func(out string) snapshotsReport {
		t.Helper()
		var rep snapshotsReport
		dec := json.NewDecoder(strings.NewReader(out))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&rep); err != nil {
			t.Fatalf("decoding %s: %v", out, err)
		}
		return rep
	}
	out, err := run(t, "inspect", "-snapshots", url, "-group", "orders-dedup", "-verify", "-json")
	if err != nil {
		t.Fatal(err)
	}
	rep := decode(out)
	if rep.Version != 1 || len(rep.Partitions) != len(states) {
		t.Fatalf("report: version %d, %d partitions", rep.Version, len(rep.Partitions))
	}
	for i, s := range states {
		pr := rep.Partitions[i]
		if pr.Topic != s.tp.Topic || pr.Partition != s.tp.Partition || len(pr.Snapshots) != 1 {
			t.Fatalf("partition %d: %+v, want one snapshot of %s", i, pr, s.tp)
		}
		sr, want := pr.Snapshots[0], ref[s.tp]
		if sr.Offset != int64(len(s.recs)) || sr.LeaderEpoch != s.epoch || sr.Verified == nil || *sr.Verified != "ok" ||
			sr.SubFilters != len(want.meta.SubFilters) || sr.Items != want.stats.Items || sr.StateBytes != sr.Pages*testPageBytes {
			t.Errorf("%s: %+v; want offset %d, epoch %d, verified ok, %d sub-filters, %d items", s.tp, sr, len(s.recs), s.epoch, len(want.meta.SubFilters), want.stats.Items)
		}
	}

	if out, err := run(t, "inspect", "-snapshots", url, "-group", "another-group", "-json"); err != nil || len(decode(out).Partitions) != 0 {
		t.Fatalf("another group's listing: %v\n%s", err, out)
	}

	bad := states[1].tp
	b, err := os.ReadFile(objects[bad])
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 4
	if err := os.WriteFile(objects[bad], b, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err = run(t, "inspect", "-snapshots", url, "-group", "orders-dedup", "-verify", "-json")
	if !errors.Is(err, errVerify) || exitCode(err) != 1 {
		t.Fatalf("inspect -verify of a damaged snapshot: %v (exit %d), want errVerify, exit 1", err, exitCode(err))
	}
	for _, pr := range decode(out).Partitions {
		v := *pr.Snapshots[0].Verified
		if tp := (store.TopicPartition{Topic: pr.Topic, Partition: pr.Partition}); (tp == bad) != strings.Contains(v, "corrupt") || (tp != bad && v != "ok") {
			t.Errorf("%s verified %q", tp, v)
		}
	}
	text, err := run(t, "inspect", "-snapshots", url, "-group", "orders-dedup", "-topic", bad.Topic, "-partition", "1")
	if err != nil || !strings.Contains(text, "orders/1: 1 snapshots") || strings.Contains(text, "orders/0") {
		t.Fatalf("text listing of orders/1: %v\n%s", err, text)
	}
}

// TestInspectSnapshotsHidesCredentials: a -snapshots URL holding a password
// that the worker would refuse is refused before the store is opened, as a
// usage error that names the URL without its password (neither
// snapshot.Open's parse error nor gocloud's "no driver registered" quotes
// it).
func TestInspectSnapshotsHidesCredentials(t *testing.T) {
	dir := filepath.ToSlash(t.TempDir())
	for _, tc := range []struct {
		url, wantShown, wantReason string
	}{
		{"https://AKIAIOSFODNN7EXAMPLE:s3cr3tpass@s3.eu-west-1.amazonaws.com/bucket", "https://AKIAIOSFODNN7EXAMPLE:xxxxx@s3.eu-west-1.amazonaws.com/bucket",
			"must start with s3://, gs://, azblob:// or file://"},
		{"s3://AKIAIOSFODNN7EXAMPLE:s3cr3tpass@bucket/%zz", "s3://xxxxx@bucket/%zz",
			"must be a URL: it has a '%' not followed by two hexadecimal digits (write a literal '%' as %25)"},
		{"file://kdedup:s3cr3tpass@" + dir, "file://kdedup:xxxxx@" + dir,
			"must not hold credentials: the store's SDK reads them from its usual sources (environment, files, pod identity)"},
	} {
		t.Run(tc.url, func(t *testing.T) {
			_, err := run(t, "inspect", "-snapshots", tc.url)
			want := "usage: -snapshots " + tc.wantShown + ": " + tc.wantReason
			if !errors.Is(err, errUsage) || err.Error() != want {
				t.Errorf("error %v, want %q (errUsage)", err, want)
			}
		})
	}
}
