package filter

import (
	"bytes"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// TestSeedPerChain: chains created with New draw different secret seeds
// and place one key differently; the seed is kept in the metadata, so a
// reopened chain hashes as before and finds every key.
func TestSeedPerChain(t *testing.T) {
	p := Params{Capacity: 10_000}
	a, err := New(p, NewMemPager(DefaultPageBytes))
	if err != nil {
		t.Fatal(err)
	}
	pager := NewMemPager(DefaultPageBytes)
	b, err := New(p, pager)
	if err != nil {
		t.Fatal(err)
	}
	if a.seed == b.seed {
		t.Fatalf("two new chains share the seed %#x", a.seed)
	}
	victim := []byte("order-17")
	var pa, pb position // MemPager reads do not fail
	_, _ = a.open(&pa, a.hash(victim), 0)
	_, _ = b.open(&pb, b.hash(victim), 0)
	if pa.id == pb.id && pa.b1 == pb.b1 && pa.entry() == pb.entry() {
		t.Fatalf("both chains place %s at page %d, bucket %d, fingerprint %#x", victim, pa.id.Page, pa.b1, pa.entry())
	}

	for i := range 5000 {
		if _, err := b.Insert(key("k", i)); err != nil {
			t.Fatal(err)
		}
	}
	meta := b.MarshalMeta()
	m, err := DecodeMeta(meta)
	if err != nil {
		t.Fatal(err)
	}
	if m.Seed != b.seed || m.HashID != HashSipHash24 {
		t.Fatalf("metadata holds seed %#x hash %d, the chain %#x hash %d", m.Seed, m.HashID, b.seed, HashSipHash24)
	}
	re, err := Open(meta, p, pager)
	if err != nil {
		t.Fatal(err)
	}
	if re.seed != b.seed || !bytes.Equal(re.MarshalMeta(), meta) {
		t.Fatalf("reopened with seed %#x, stored %#x", re.seed, b.seed)
	}
	for i := range 5000 {
		if ok, err := re.Contains(key("k", i)); err != nil || !ok {
			t.Fatalf("reopened chain: Contains(k%d) = %v, %v", i, ok, err)
		}
	}
}

// TestCraftedCollisionsSpreadUnderASecretSeed plays the attack on the
// former unkeyed hash: knowing it (xxhash64), an attacker searches keys
// that share a victim's page, buckets and fingerprint (cheap here: one
// 512-byte page of 8-bit fingerprints), sends one first, and the victim's
// only record is dropped as a duplicate. Under the chain's secret seed the
// same keys land elsewhere and the victim's record is forwarded. (Without
// the seed an attacker can only send keys at random: each collides with
// probability about 2/(buckets*2^f).)
func TestCraftedCollisionsSpreadUnderASecretSeed(t *testing.T) {
	p := Params{FingerprintBits: 8, Capacity: 400, PageBytes: 512}
	c, err := NewWithSeed(p, testSeed, NewMemPager(512))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.subs) != 1 || c.subs[0].Pages != 1 {
		t.Fatalf("want one page, got %+v", c.subs)
	}
	victim := []byte("user-4711")
	// collides reports whether k shares victim's page, a bucket and the
	// fingerprint under hash h.
	collides := func(h func([]byte) uint64, k []byte) bool {
		var v, x position // MemPager reads do not fail
		_, _ = c.open(&v, h(victim), 0)
		_, _ = c.open(&x, h(k), 0)
		return x.id == v.id && x.entry() == v.entry() && (x.b1 == v.b1 || x.b1 == v.b2)
	}
	var crafted [][]byte
	for i := 0; len(crafted) < 40; i++ {
		if k := key("attacker-", i); collides(xxhash.Sum64, k) {
			crafted = append(crafted, k)
		}
	}
	n := 0
	for _, k := range crafted {
		if collides(c.hash, k) {
			n++
		}
		if _, err := c.Insert(k); err != nil {
			t.Fatal(err)
		}
	}
	// By chance a key collides with probability about 2/(128*2^8),
	// 1/16,384 here.
	if n != 0 {
		t.Fatalf("%d of %d keys crafted against the unkeyed hash collide with the victim under a secret seed", n, len(crafted))
	}
	if added, err := c.Insert(victim); err != nil || !added {
		t.Fatalf("the victim's record after %d crafted keys: added=%v, %v; want it forwarded", len(crafted), added, err)
	}
}
