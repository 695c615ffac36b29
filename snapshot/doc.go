// Package snapshot keeps snapshots of topic-partitions' dedup state in an
// object store, so that a partition moved to a worker without its state
// restores the newest snapshot and replays only the input after it,
// instead of its whole history (the worker's side is consumer/snapshot.go).
//
// # What a snapshot is
//
// One topic-partition's state as of one write batch, read by
// store.DB.Export from one Badger read timestamp: the chain metadata
// (filter parameters, hash seed, key spec, format version, sub-filters),
// every stored page with its deltas folded in, and the checkpoint offset.
// It is written as one data object (format.go: a zstd stream of a
// versioned header and the pages) and then a manifest (JSON: offset,
// object key, size and SHA-256 of the object, page count), created only if
// no object of its name exists. A snapshot whose manifest is absent does
// not exist: a writer killed in the middle of an upload leaves at most an
// object no manifest names, which Store.Prune deletes once it is older
// than its grace period.
//
// # Reading one back
//
// Store.Fetch downloads a snapshot into a local file and checks its size
// and SHA-256 against the manifest before the caller replaces anything;
// Fetched.Load then hands the metadata and pages to
// dedup.Deduplicator.Restore, which checks the filter parameters and
// imports them (store.PartitionState.Import, atomic for readers of the
// store: a crash in the middle leaves no state, never a partial one).
// Store.Load checks the object's size and SHA-256 in a first pass and
// decodes it in a second (kdedup inspect -verify).
//
// # What a bucket writer can do
//
// A principal that can write under the store's prefix chooses the state
// a restoring worker imports (the snapshot carries the hash seed), but
// not how much memory or disk the restore takes: List reads at most 64
// KiB of a manifest, Fetch writes at most the manifest's size plus one
// byte, the decoder refuses a zstd window over 8 MiB and more pages, or
// pages of another size, than the manifest lists, and Import refuses
// pages that are not its metadata's (Manifest.RestoreBytes is what a
// restore may take on disk).
//
// # Store
//
// gocloud.dev/blob opens the bucket from one URL: s3:// (S3 and
// S3-compatible servers), gs://, azblob://, file://. Credentials come from
// each cloud SDK's usual sources, never from the URL. The snapshots of
// each consumer group live under its own prefix (Store.In). The objects
// hold the chains' secret hash seeds, as the data directory does.
package snapshot
