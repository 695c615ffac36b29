// Package config owns kdedup's runtime configuration: the KDEDUP_*
// environment variables, their defaults, and the rules that make a set of
// them valid.
//
// Configuration follows the twelve-factor convention: every setting is an
// environment variable, parsed into one [Config] by caarlos0/env. The struct
// tags on [Config] are the single source of truth for each variable's name,
// default and meaning; [Config.Table] renders them for --help and the docs,
// so nothing else should restate them.
//
// [Load] reports every problem at once, parse errors and rule violations
// alike, in one [*Error] whose lines read "KDEDUP_BUCKET_SIZE=3: must be 2,
// 4 or 8". An operator fixing a deployment sees the whole list, not one
// problem per restart.
//
// A variable that is set but empty takes its default, as an unset one does.
// A non-empty KDEDUP_* variable that Config does not have stops start-up
// like a bad value, naming the closest known variable: a misspelt name
// must not silently leave a setting at its default.
//
// A limit or default that belongs to another package is that package's:
// config validates through the filter's limits (filter.MaxMaxKicks,
// filter.ValidBucketSize, Params.MaxCapacity and the like), the store's
// (store.MaxFlushBytes), dedup's key parser (dedup.ParseKey) and the
// consumer's delivery names (consumer.Delivery), and its tests tie each
// envDefault to the owner's default. The limits config adds of its own,
// such as the supported page sizes, say why beside their constants.
// KDEDUP_DELIVERY, KDEDUP_START_OFFSET and KDEDUP_REBUILD are parsed once,
// into typed values, so that nothing compares their strings again.
//
// Other packages never import config: internal/app copies the fields they
// need into each package's own Options struct.
package config
