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
// A rule or default that belongs to another package is that package's.
// config maps the variables to each owner's options (Config.FilterParams,
// Config.StoreOptions, Config.DedupOptions, Config.ConsumerOptions, the
// snapshot URL) and asks the owner's Validate (filter.Params.Validate,
// store.Options.Validate, dedup.Options.Validate,
// consumer.Options.Validate, snapshot.CheckURL), each of which lists the
// fields it cannot honour (internal/optcheck); config names the variable
// behind each field. config's own rules are only what no owner checks:
// the syntax of its variables (a broker's host:port, Kafka's topic
// names, NAME=VALUE), the ranges kdedup supports where they are narrower
// than an owner's (page sizes, intervals and timeouts, each constant
// saying why), the process's settings (logging, HTTP, TLS, SASL) and the
// rules that relate two owners' options (the store's write-back interval
// against the consumer's flush interval). Its tests tie each envDefault
// to the owner's default. KDEDUP_DELIVERY, KDEDUP_START_OFFSET and
// KDEDUP_REBUILD are parsed once, into typed values, so that nothing
// compares their strings again.
//
// Other packages never import config: internal/app takes each package's
// options from [Config.Options], which validates once and maps once, and
// fills in what the process provides (the memory budget's shares, the
// Kafka connection, the logger).
package config
