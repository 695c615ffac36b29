package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/kdedup/kdedup/filter"
	"github.com/kdedup/kdedup/internal/optcheck"
	"github.com/kdedup/kdedup/snapshot"
)

// errVerify is the error of `kdedup inspect -snapshots URL -verify` when a
// snapshot fails its check (exit code 1).
var errVerify = errors.New("snapshots failed verification")

// snapshotsReport is the document `kdedup inspect -snapshots URL -json`
// prints (version 1).
type snapshotsReport struct {
	Version int `json:"version"`
	// Store is the URL without its query.
	Store      string                    `json:"store"`
	Partitions []snapshotPartitionReport `json:"partitions"`
}

type snapshotPartitionReport struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	// Snapshots, newest first; Skipped are manifests that could not be
	// read or parsed.
	Snapshots []snapshotReport `json:"snapshots"`
	Skipped   []string         `json:"skipped"`
}

type snapshotReport struct {
	// Manifest is the manifest's object key.
	Manifest string `json:"manifest"`
	// Offset is the checkpoint offset of the state.
	Offset      int64  `json:"offset"`
	LeaderEpoch int32  `json:"leader_epoch"`
	Created     string `json:"created"`
	// Bytes is the object's size, StateBytes the pages before compression.
	Bytes      int64 `json:"bytes"`
	StateBytes int64 `json:"state_bytes"`
	Pages      int64 `json:"pages"`
	// Verified is null without -verify, else "ok" or the failure.
	Verified *string `json:"verified"`
	// SubFilters and Items are read from the snapshot's chain metadata
	// with -verify (0 without).
	SubFilters int    `json:"sub_filters"`
	Items      uint64 `json:"items"`
}

// inspectSnapshots lists (and with verify, checks) the snapshots of the
// store at rawURL selected by sel. rawURL passes the worker's rule for
// KDEDUP_SNAPSHOT_URL first, so that no error prints credentials it holds
// (it is printed through optcheck.RedactURL, never as given).
func inspectSnapshots(rawURL, group string, sel stateFlags, verify, asJSON bool, stdout io.Writer) error {
	if err := snapshot.CheckURL(rawURL); err != nil {
		return fmt.Errorf("%w: -snapshots %s: %s", errUsage, optcheck.RedactURL(rawURL), optcheck.Reasons(err))
	}
	ctx := context.Background()
	root, err := snapshot.Open(ctx, rawURL)
	if err != nil {
		return fmt.Errorf("%w: -snapshots: %v", errUsage, err)
	}
	st := root.In(group)
	defer st.Close()
	tps, err := st.Partitions(ctx)
	if err != nil {
		return err
	}
	rep := snapshotsReport{Version: reportVersion, Store: st.String(), Partitions: []snapshotPartitionReport{}}
	failed := 0
	for _, tp := range tps {
		if !sel.matches(tp) {
			continue
		}
		ms, skipped, err := st.List(ctx, tp)
		if err != nil {
			return err
		}
		pr := snapshotPartitionReport{Topic: tp.Topic, Partition: tp.Partition, Snapshots: []snapshotReport{}, Skipped: []string{}}
		for _, e := range skipped {
			pr.Skipped = append(pr.Skipped, e.Error())
		}
		for _, m := range ms {
			sr := snapshotReport{Manifest: m.Key(), Offset: m.Offset, LeaderEpoch: m.LeaderEpoch, Created: m.Created.UTC().Format(time.RFC3339Nano),
				Bytes: m.Bytes, StateBytes: m.StateBytes(), Pages: m.Pages}
			if verify {
				res := "ok"
				img, err := st.Verify(ctx, m)
				var meta filter.Meta
				if err == nil {
					meta, err = filter.DecodeMeta(img.Meta)
				}
				if err != nil {
					res, failed = err.Error(), failed+1
				} else {
					sr.SubFilters = len(meta.SubFilters)
					for _, sf := range meta.SubFilters {
						sr.Items += sf.Items
					}
				}
				sr.Verified = &res
			}
			pr.Snapshots = append(pr.Snapshots, sr)
		}
		rep.Partitions = append(rep.Partitions, pr)
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		writeSnapshotsText(stdout, rep)
	}
	if failed > 0 {
		return fmt.Errorf("%w: %d of them", errVerify, failed)
	}
	return nil
}

func writeSnapshotsText(w io.Writer, rep snapshotsReport) {
	fmt.Fprintf(w, "snapshot store %s: %d topic-partitions\n", rep.Store, len(rep.Partitions))
	for _, p := range rep.Partitions {
		fmt.Fprintf(w, "\n%s/%d: %d snapshots\n", p.Topic, p.Partition, len(p.Snapshots))
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "offset\tcreated\tbytes\tstate bytes\tpages\tverified\t")
		for _, s := range p.Snapshots {
			v := "-"
			if s.Verified != nil {
				v = *s.Verified
			}
			fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%d\t%s\t\n", s.Offset, s.Created, s.Bytes, s.StateBytes, s.Pages, v)
		}
		tw.Flush()
		for _, s := range p.Skipped {
			fmt.Fprintf(w, "  skipped: %s\n", s)
		}
	}
}
