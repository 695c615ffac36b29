package store

import (
	"encoding/binary"
	"fmt"

	"github.com/kdedup/kdedup/filter"
)

// Key layout; see the package comment. Every integer is big-endian.
const (
	layoutVersion uint32 = 3

	tagLayout     byte = 'v' // DB-wide: uint32 layout version
	tagPartition  byte = 't' // 't' | uint16 len(topic) | topic | int32 partition
	tagMeta       byte = 'm' // after a partition prefix: chain metadata
	tagCheckpoint byte = 'c' // after a partition prefix: int64 offset | int32 leader epoch
	tagPage       byte = 'p' // after a partition prefix: uint32 sub-filter | uint32 page
	tagLog        byte = 'l' // after a partition prefix: uint64 write-batch sequence number
	tagSequence   byte = 's' // after a partition prefix: uint64 sequence number of the last write batch
	tagDropped    byte = 'd' // after a partition prefix: uint32 sub-filter whose pages are to be deleted
	tagImporting  byte = 'i' // after a partition prefix: an Import not finished (empty value)
	tagOrigin     byte = 'o' // after a partition prefix: the state's topic ID and cluster ID (origin.go)

	// maxTopicBytes is Kafka's limit on a topic name (Topic.MAX_NAME_LENGTH
	// in Kafka's common/internals/Topic.java). Bounding the key length lets
	// Open size Badger's transaction limit for the worst case.
	maxTopicBytes = 249

	checkpointBytes = 8 + 4
	pageKeySuffix   = 1 + 4 + 4
	// maxPageKeyBytes is the longest page key any partition can produce.
	maxPageKeyBytes = 1 + 2 + maxTopicBytes + 4 + pageKeySuffix
	// maxLogKeyBytes is the longest log key.
	maxLogKeyBytes = 1 + 2 + maxTopicBytes + 4 + 1 + 8
	// pageBaseHeader is the uint64 before the page bytes of a base entry:
	// its floor, the sequence number of the last write batch whose
	// changes of the page it holds.
	pageBaseHeader = 8
	// seqBytes is a write-batch sequence number.
	seqBytes = 8
)

// layoutKey is the single DB-wide key holding the layout version.
var layoutKey = []byte{tagLayout}

// partitionPrefix returns the prefix shared by every key of one
// topic-partition, and by no key of another one (the topic length comes
// before the topic, so "a" and "ab" cannot overlap). Badger's DropPrefix on
// it removes the partition's whole state; note that DropPrefix blocks every
// write to the DB while it runs.
func partitionPrefix(topic string, partition int32) []byte {
	k := make([]byte, 0, 1+2+len(topic)+4)
	k = append(k, tagPartition)
	k = binary.BigEndian.AppendUint16(k, uint16(len(topic)))
	k = append(k, topic...)
	return binary.BigEndian.AppendUint32(k, uint32(partition))
}

// decodePartitionPrefix parses the partition prefix at the start of key and
// returns the topic-partition and the prefix length.
func decodePartitionPrefix(key []byte) (TopicPartition, int, error) {
	if len(key) < 3 || key[0] != tagPartition {
		return TopicPartition{}, 0, fmt.Errorf("store: decoding key %x: not a partition key: %w", key, ErrCorrupt)
	}
	n := 3 + int(binary.BigEndian.Uint16(key[1:3]))
	if len(key) < n+4 {
		return TopicPartition{}, 0, fmt.Errorf("store: decoding key %x: %d bytes, partition prefix needs %d: %w", key, len(key), n+4, ErrCorrupt)
	}
	tp := TopicPartition{
		Topic:     string(key[3:n]),
		Partition: int32(binary.BigEndian.Uint32(key[n : n+4])),
	}
	return tp, n + 4, nil
}

func metaKey(prefix []byte) []byte {
	return append(append(make([]byte, 0, len(prefix)+1), prefix...), tagMeta)
}

func checkpointKey(prefix []byte) []byte {
	return append(append(make([]byte, 0, len(prefix)+1), prefix...), tagCheckpoint)
}

func pageKey(prefix []byte, id filter.PageID) []byte {
	k := make([]byte, 0, len(prefix)+pageKeySuffix)
	k = append(k, prefix...)
	k = append(k, tagPage)
	k = binary.BigEndian.AppendUint32(k, id.SubFilter)
	return binary.BigEndian.AppendUint32(k, id.Page)
}

// logKey is the key of the log entry of write batch seq: the log entries
// of a partition iterate in the order they were written.
func logKey(prefix []byte, seq uint64) []byte {
	k := make([]byte, 0, len(prefix)+1+seqBytes)
	k = append(k, prefix...)
	k = append(k, tagLog)
	return binary.BigEndian.AppendUint64(k, seq)
}

// logPrefix is the prefix of every log key of a partition.
func logPrefix(prefix []byte) []byte {
	return append(append(make([]byte, 0, len(prefix)+1), prefix...), tagLog)
}

func sequenceKey(prefix []byte) []byte {
	return append(append(make([]byte, 0, len(prefix)+1), prefix...), tagSequence)
}

// subFilterPagesPrefix is the prefix of every page key of one sub-filter.
func subFilterPagesPrefix(prefix []byte, subFilter uint32) []byte {
	k := make([]byte, 0, len(prefix)+1+4)
	k = append(k, prefix...)
	k = append(k, tagPage)
	return binary.BigEndian.AppendUint32(k, subFilter)
}

func droppedKey(prefix []byte, subFilter uint32) []byte {
	k := make([]byte, 0, len(prefix)+1+4)
	k = append(k, prefix...)
	k = append(k, tagDropped)
	return binary.BigEndian.AppendUint32(k, subFilter)
}

func encodeCheckpoint(cp Checkpoint) []byte {
	b := make([]byte, 0, checkpointBytes)
	b = binary.BigEndian.AppendUint64(b, uint64(cp.Offset))
	return binary.BigEndian.AppendUint32(b, uint32(cp.LeaderEpoch))
}

func decodeCheckpoint(b []byte) (Checkpoint, error) {
	if len(b) != checkpointBytes {
		return Checkpoint{}, fmt.Errorf("store: decoding checkpoint: %d bytes, want %d: %w", len(b), checkpointBytes, ErrCorrupt)
	}
	return Checkpoint{
		Offset:      int64(binary.BigEndian.Uint64(b[:8])),
		LeaderEpoch: int32(binary.BigEndian.Uint32(b[8:])),
	}, nil
}
