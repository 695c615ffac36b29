package config

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/kdedup/kdedup/internal/optcheck"
)

// unknownProblems reports every variable of environ that starts with Prefix,
// is set to a non-empty value and is not a field of Config: a misspelt
// name (KDEDUP_DELIVER=exactly-once) would otherwise be ignored and the
// worker run with the default. Each problem names the closest known
// variable. The variables Kubernetes derives from Services whose names
// start with "kdedup" (service links) are not kdedup's and are skipped.
func unknownProblems(environ map[string]string, fields []field) []Problem {
	known := make(map[string]bool, len(fields))
	for _, f := range fields {
		known[f.envVar] = true
	}
	var problems []Problem
	for name, value := range environ {
		if !strings.HasPrefix(name, Prefix) || known[name] || value == "" || serviceLink(name, value) {
			continue
		}
		closest := closestName(name, fields)
		// An unknown value may be anything: a URL's user info is never
		// printed either.
		shown := optcheck.RedactURL(value)
		if closest.secret || secretLooking(name) {
			shown = hiddenValue
		}
		problems = append(problems, Problem{Var: name, Value: shown,
			Reason: fmt.Sprintf("unknown variable: kdedup reads no such setting (did you mean %s?)", closest.envVar)})
	}
	slices.SortFunc(problems, func(a, b Problem) int { return strings.Compare(a.Var, b.Var) })
	return problems
}

// serviceLinkName matches the variables the kubelet sets for a Service
// (NAME_SERVICE_HOST, NAME_SERVICE_PORT, NAME_SERVICE_PORT_<port name>,
// NAME_PORT_<port>_<protocol> and its _PROTO, _PORT and _ADDR), and
// serviceLinkURL the value of NAME_PORT (tcp://10.0.0.1:8080).
var (
	serviceLinkName = regexp.MustCompile(`^[A-Z0-9_]+_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT_[0-9]+_(TCP|UDP|SCTP)(_(PROTO|PORT|ADDR))?)$`)
	serviceLinkURL  = regexp.MustCompile(`^(tcp|udp|sctp)://`)
)

// serviceLink reports whether name=value is a Kubernetes service link
// variable.
func serviceLink(name, value string) bool {
	return serviceLinkName.MatchString(name) || strings.HasSuffix(name, "_PORT") && serviceLinkURL.MatchString(value)
}

// secretLooking reports whether an unknown name may hold a secret, whose
// value a problem must not print.
func secretLooking(name string) bool {
	for _, w := range []string{"PASS", "SECRET", "TOKEN", "CREDENTIAL"} {
		if strings.Contains(name, w) {
			return true
		}
	}
	return false
}

// closestName is the known variable nearest to name in edit distance;
// ties go to the earlier field.
func closestName(name string, fields []field) field {
	best, bestDist := fields[0], -1
	for _, f := range fields {
		if d := editDistance(name, f.envVar); bestDist < 0 || d < bestDist {
			best, bestDist = f, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, in bytes
// (variable names are ASCII).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
