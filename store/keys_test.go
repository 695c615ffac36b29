package store

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/kdedup/kdedup/filter"
)

func TestKeyEncoding(t *testing.T) {
	tests := []struct {
		name string
		got  []byte
		want []byte
	}{
		{"prefix", partitionPrefix("ab", 3), []byte{'t', 0, 2, 'a', 'b', 0, 0, 0, 3}},
		{"prefix negative partition", partitionPrefix("x", -1), []byte{'t', 0, 1, 'x', 0xff, 0xff, 0xff, 0xff}},
		{"meta", metaKey(partitionPrefix("ab", 3)), []byte{'t', 0, 2, 'a', 'b', 0, 0, 0, 3, 'm'}},
		{"checkpoint", checkpointKey(partitionPrefix("ab", 3)), []byte{'t', 0, 2, 'a', 'b', 0, 0, 0, 3, 'c'}},
		{
			"page",
			pageKey(partitionPrefix("ab", 3), filter.PageID{SubFilter: 0x01020304, Page: 0x0a0b0c0d}),
			[]byte{'t', 0, 2, 'a', 'b', 0, 0, 0, 3, 'p', 1, 2, 3, 4, 0x0a, 0x0b, 0x0c, 0x0d},
		},
		{"layout", layoutKey, []byte{'v'}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !bytes.Equal(tt.got, tt.want) {
				t.Errorf("got %x, want %x", tt.got, tt.want)
			}
		})
	}

	longest := strings.Repeat("t", maxTopicBytes)
	if got := len(pageKey(partitionPrefix(longest, 0), filter.PageID{})); got != maxPageKeyBytes {
		t.Errorf("page key of the longest topic is %d bytes, maxPageKeyBytes is %d", got, maxPageKeyBytes)
	}
}

// TestPartitionPrefixDisjoint checks that no key of one topic-partition
// starts with another one's prefix, so DropPrefix and prefix iteration stay
// within a partition.
func TestPartitionPrefixDisjoint(t *testing.T) {
	tps := []TopicPartition{
		{"a", 0}, {"a", 1}, {"ab", 0}, {"a\x00", 0}, {"b", 0}, {"a", 256}, {"a", -1},
		{"\x00\x01a", 0}, {strings.Repeat("z", maxTopicBytes), math.MaxInt32},
	}
	for _, owner := range tps {
		pre := partitionPrefix(owner.Topic, owner.Partition)
		keys := [][]byte{
			metaKey(pre), checkpointKey(pre),
			pageKey(pre, filter.PageID{}), pageKey(pre, filter.PageID{SubFilter: math.MaxUint32, Page: math.MaxUint32}),
		}
		for _, k := range keys {
			got, n, err := decodePartitionPrefix(k)
			if err != nil || got != owner || n != len(pre) {
				t.Errorf("decodePartitionPrefix(%x) = %v, %d, %v; want %v, %d", k, got, n, err, owner, len(pre))
			}
			for _, other := range tps {
				if other != owner && bytes.HasPrefix(k, partitionPrefix(other.Topic, other.Partition)) {
					t.Errorf("key %x of %v has the prefix of %v", k, owner, other)
				}
			}
		}
	}
}

func TestDecodePartitionPrefixCorrupt(t *testing.T) {
	for _, k := range [][]byte{nil, {'t'}, {'t', 0}, {'t', 0, 5, 'a'}, {'t', 0, 1, 'a', 0, 0, 0}, {'m', 0, 0, 0, 0, 0, 0}} {
		if _, _, err := decodePartitionPrefix(k); !errors.Is(err, ErrCorrupt) {
			t.Errorf("decodePartitionPrefix(%x) = %v, want ErrCorrupt", k, err)
		}
	}
}

func TestCheckpointRoundTrip(t *testing.T) {
	tests := []Checkpoint{
		{},
		{Offset: 1, LeaderEpoch: -1},
		{Offset: math.MaxInt64, LeaderEpoch: math.MaxInt32},
		{Offset: math.MinInt64, LeaderEpoch: math.MinInt32},
		{Offset: 1<<40 + 7, LeaderEpoch: 12},
	}
	for _, cp := range tests {
		b := encodeCheckpoint(cp)
		if len(b) != checkpointBytes {
			t.Errorf("encodeCheckpoint(%+v) is %d bytes, want %d", cp, len(b), checkpointBytes)
		}
		got, err := decodeCheckpoint(b)
		if err != nil || got != cp {
			t.Errorf("decodeCheckpoint(encodeCheckpoint(%+v)) = %+v, %v", cp, got, err)
		}
	}
	if got := encodeCheckpoint(Checkpoint{Offset: 0x0102030405060708, LeaderEpoch: 0x0a0b0c0d}); !bytes.Equal(got,
		[]byte{1, 2, 3, 4, 5, 6, 7, 8, 0x0a, 0x0b, 0x0c, 0x0d}) {
		t.Errorf("encodeCheckpoint is not big-endian offset then epoch: %x", got)
	}
	for _, b := range [][]byte{nil, make([]byte, 11), make([]byte, 13)} {
		if _, err := decodeCheckpoint(b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("decodeCheckpoint(%d bytes) = %v, want ErrCorrupt", len(b), err)
		}
	}
}
