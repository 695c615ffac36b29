package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Set at link time by release builds (.github/workflows/release.yml, the
// Dockerfile's VERSION and COMMIT build arguments):
//
//	go build -ldflags "-X main.buildVersion=v0.1.0 -X main.buildCommit=$(git rev-parse HEAD)" ./cmd/kdedup
//
// Either may be left empty; buildInfo then falls back to what the Go
// toolchain stamps into the binary.
var (
	buildVersion string
	buildCommit  string
)

// build describes the running binary, as `kdedup version` prints it.
type build struct {
	// Version is the release tag set at link time, else the module version
	// Go stamps (`go install github.com/kdedup/kdedup/cmd/kdedup@v0.1.0`, or
	// since Go 1.24 the tag or pseudo-version of the checkout built), else
	// "devel".
	Version string
	// Commit is the VCS revision set at link time, else the vcs.revision Go
	// stamps when building from a checkout, else "unknown".
	Commit string
	// Modified reports vcs.modified: the checkout had uncommitted changes.
	// Only read from the build info, and only when Commit came from there.
	Modified bool
	// GoVersion is the toolchain that built the binary (runtime.Version()).
	GoVersion string
}

// currentBuild describes this binary.
func currentBuild() build {
	info, _ := debug.ReadBuildInfo() // nil when the binary carries none
	return buildInfo(buildVersion, buildCommit, runtime.Version(), info)
}

// buildInfo resolves the version and commit: the link-time values first,
// then info (nil when the binary carries no build information, as with
// some stripped builds). `go run` and `go test` stamp no VCS settings, and
// a build with -buildvcs=false or outside a checkout (the Dockerfile's
// build context has no .git) neither, hence the link-time values.
func buildInfo(version, commit, goVersion string, info *debug.BuildInfo) build {
	b := build{Version: version, Commit: commit, GoVersion: goVersion}
	if info != nil {
		if b.Version == "" && info.Main.Version != "" && info.Main.Version != "(devel)" {
			b.Version = info.Main.Version
		}
		if b.Commit == "" {
			for _, s := range info.Settings {
				switch s.Key {
				case "vcs.revision":
					b.Commit = s.Value
				case "vcs.modified":
					b.Modified = s.Value == "true"
				}
			}
			if b.Commit == "" {
				b.Modified = false
			}
		}
	}
	if b.Version == "" {
		b.Version = "devel"
	}
	if b.Commit == "" {
		b.Commit = "unknown"
	}
	return b
}

// String is the line `kdedup version` prints, e.g.
// "kdedup v0.1.0 commit 5cc47a6f... go1.26.8 linux/amd64"; a commit built
// with uncommitted changes is followed by "(modified)".
func (b build) String() string {
	commit := b.Commit
	if b.Modified {
		commit += " (modified)"
	}
	return fmt.Sprintf("kdedup %s commit %s %s %s/%s", b.Version, commit, b.GoVersion, runtime.GOOS, runtime.GOARCH)
}
