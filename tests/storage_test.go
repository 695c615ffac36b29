package tests

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// mountTmpfs mounts a tmpfs of size bytes on a new directory for the
// test's duration, or skips the test when mounting is refused (it needs
// root); store's TestDiskFullCommit covers the same refusal with a statfs
// stub and always runs.
func mountTmpfs(t *testing.T, size int64) string {
	t.Helper()
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", size), "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Skipf("mounting a %d-byte tmpfs was refused (needs root): %v: %s", size, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", "-l", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", mnt, err, out)
		}
	})
	return mnt
}

func resizeTmpfs(t *testing.T, mnt string, size int64) {
	t.Helper()
	if out, err := exec.Command("mount", "-o", fmt.Sprintf("remount,size=%d", size), mnt).CombinedOutput(); err != nil {
		t.Fatalf("resizing the tmpfs on %s to %d bytes: %v: %s", mnt, size, err, out)
	}
}

func usedBytes(t *testing.T, mnt string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(mnt, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize
}

// requireStoppedWith requires that the process exits with code and that
// its log says every string of want.
func (p *process) requireStoppedWith(t *testing.T, code int, want ...string) {
	t.Helper()
	if got := p.waitExit(t, time.Minute); got != code {
		t.Fatalf("worker exited with %d, want %d:\n%s", got, code, p.logText(t))
	}
	log := p.logText(t)
	for _, s := range want {
		if !strings.Contains(log, s) {
			t.Errorf("the worker's log does not say %q:\n%s", s, log)
		}
	}
}

// TestDiskFull: when its data directory runs short of space while input
// arrives, the worker stops with exit code 1 and an error naming
// KDEDUP_DATA_DIR, the free and the needed bytes (never Badger's SIGBUS,
// exit 2); it refuses to start while space is short; once there is room it
// resumes and nothing the model forwards is missing.
func TestDiskFull(t *testing.T) {
	const roomy = 400 << 20
	mnt := mountTmpfs(t, roomy)
	dir := filepath.Join(mnt, "state")
	p := newPipeline(t, 2)
	recs := stream(21)
	f := p.feed(t, recs, 100, 20*time.Millisecond)
	pr := p.startProcess(t, dir, "KDEDUP_LOG_LEVEL=info")
	pr.waitReady(t)
	f.until(len(recs) / 4)
	// Room for what is there and 40 MiB more: below the 154 MiB a write
	// batch asks for, well above what Close needs to flush.
	resizeTmpfs(t, mnt, usedBytes(t, mnt)+40<<20)
	want := []string{"KDEDUP_DATA_DIR=" + dir, "not enough free disk space", "bytes free", "needed"}
	pr.requireStoppedWith(t, 1, want...)

	pr = p.startProcess(t, dir, "KDEDUP_LOG_LEVEL=info")
	pr.requireStoppedWith(t, 1, want...)

	resizeTmpfs(t, mnt, roomy)
	pr = p.startProcess(t, dir, "KDEDUP_LOG_LEVEL=info")
	f.wait(t)
	wantOut, got := p.output(t, recs)
	pr.kill()
	extra := requireNothingMissing(t, wantOut, got)
	t.Logf("%d records expected, %d read, %d forwarded again after the stop", wantOut.Stats.Forwarded, got.Stats.Forwarded, extra)
}

// TestCorruptStateRefused: 16 bytes flipped in a table of a stopped
// worker's data directory make the next start fail with exit code 1 and an
// error naming KDEDUP_DATA_DIR, the damaged table and the recovery (the
// damaged state is never used); after the directory is moved aside, the
// rebuild by replay gives exactly the model's output.
func TestCorruptStateRefused(t *testing.T) {
	p := newPipeline(t, 2)
	recs := stream(22)
	dir := filepath.Join(t.TempDir(), "state")
	p.feed(t, recs[:len(recs)/2], len(recs)/2, 0).wait(t)
	w := p.startWorker(t, dir)
	p.output(t, recs[:len(recs)/2])
	w.stop(t)

	tables, err := filepath.Glob(filepath.Join(dir, "*.sst"))
	if err != nil || len(tables) == 0 {
		t.Fatalf("no table in %s after a graceful stop (%v)", dir, err)
	}
	f, err := os.OpenFile(tables[0], os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	info, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 16)
	if _, err := f.ReadAt(b, info.Size()/2); err != nil {
		t.Fatal(err)
	}
	for i := range b {
		b[i] ^= 0xff
	}
	if _, err := f.WriteAt(b, info.Size()/2); err != nil {
		t.Fatal(err)
	}
	f.Close()

	pr := p.startProcess(t, dir)
	// The damage is named with its table: a bad checksum, or an index that
	// does not read, as where the middle of the file falls decides.
	pr.requireStoppedWith(t, 1, "KDEDUP_DATA_DIR="+dir, "corrupt state", "table "+filepath.Base(tables[0])+" ", "move the data directory aside")

	if err := os.Rename(dir, dir+".damaged"); err != nil {
		t.Fatal(err)
	}
	p.feed(t, recs[len(recs)/2:], len(recs)/2, 0).wait(t)
	w = p.startWorker(t, dir)
	wantOut, got := p.output(t, recs)
	w.stop(t)
	requireExact(t, wantOut, got)
}
