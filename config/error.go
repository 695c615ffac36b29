package config

import (
	"strconv"
	"strings"
	"unicode"
)

// Error is every problem found in a configuration. [Load], [LoadFrom] and
// [Config.Validate] return it as *Error; callers reach it with errors.As.
type Error struct {
	// Problems is never empty, and is in the order of the fields of Config,
	// so a variable's problems are adjacent.
	Problems []Problem
}

// Error lists every problem on its own line, e.g.
//
//	KDEDUP_BUCKET_SIZE=3: must be 2, 4 or 8
//	KDEDUP_BROKERS="": required; a comma-separated list of host:port
func (e *Error) Error() string {
	lines := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		lines[i] = p.String()
	}
	return strings.Join(lines, "\n")
}

// Problem is one reason a variable's value is unusable.
type Problem struct {
	// Var is the full variable name, e.g. "KDEDUP_BUCKET_SIZE".
	Var string
	// Value is the value as written in the environment when the variable
	// is set, otherwise the value in Config (its default, or "" when unset
	// and required).
	Value string
	// Reason says what is wrong and what is accepted.
	Reason string
}

// String formats p as VAR=VALUE: REASON. VALUE is quoted when it is empty,
// ends in a colon, or contains spaces, quotes or unprintable characters, so
// that the line stays unambiguous.
func (p Problem) String() string {
	v := p.Value
	if needsQuote(v) {
		v = strconv.Quote(v)
	}
	return p.Var + "=" + v + ": " + p.Reason
}

func needsQuote(s string) bool {
	if s == "" || strings.HasSuffix(s, ":") {
		return true
	}
	for _, r := range s {
		if unicode.IsSpace(r) || !unicode.IsPrint(r) || r == '"' {
			return true
		}
	}
	return false
}
