package config

import (
	"fmt"
	"math"
	"strconv"

	"github.com/dustin/go-humanize"
)

// ByteSize is a size in bytes, written in the environment either as a plain
// integer ("8388608") or with a unit ("8MiB", "256 MiB", "1GB"), as parsed by
// go-humanize's ParseBytes. Units are case-insensitive. IEC units (KiB, MiB,
// GiB, and the short forms Ki, Mi, Gi) are powers of 1024; SI units (kB, MB,
// GB, and K, M, G) are powers of 1000, so "4KB" is 4000 bytes, not 4096.
type ByteSize int64

// IEC byte-size units.
const (
	KiB ByteSize = 1 << (10 * (iota + 1))
	MiB
	GiB
	TiB
	PiB
	EiB
)

// UnmarshalText implements [encoding.TextUnmarshaler]. It returns an error
// for an empty or negative value, an unknown unit, or a size above
// math.MaxInt64 bytes. A fractional result ("1.5B") is truncated to whole
// bytes.
func (b *ByteSize) UnmarshalText(text []byte) error {
	s := string(text)
	n, err := humanize.ParseBytes(s)
	if err != nil {
		return fmt.Errorf("parsing byte size %q: %w", s, err)
	}
	if n > math.MaxInt64 {
		return fmt.Errorf("parsing byte size %q: larger than %d bytes", s, int64(math.MaxInt64))
	}
	*b = ByteSize(n)
	return nil
}

// FloorMiB rounds b down to a whole MiB when it is at least 1MiB, for limits
// printed to users ("99MiB" rather than "104473088B").
func (b ByteSize) FloorMiB() ByteSize {
	if b < MiB {
		return b
	}
	return b / MiB * MiB
}

// String formats b exactly, in the largest IEC unit that divides it evenly
// ("4KiB", "256MiB"), or in bytes ("1000000000B") when none does, so that the
// result parses back to the same value.
func (b ByteSize) String() string {
	if b == 0 {
		return "0B"
	}
	units := [...]struct {
		size ByteSize
		name string
	}{{EiB, "EiB"}, {PiB, "PiB"}, {TiB, "TiB"}, {GiB, "GiB"}, {MiB, "MiB"}, {KiB, "KiB"}}
	for _, u := range units {
		if b%u.size == 0 {
			return strconv.FormatInt(int64(b/u.size), 10) + u.name
		}
	}
	return strconv.FormatInt(int64(b), 10) + "B"
}
