package manifest

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/openclaw/cloudworkers/internal/atomicfile"
)

// Cache remembers file hashes by size, mtime, ctime and inode, so that Build does not re-hash
// files that did not change. It is safe for concurrent use.
type Cache struct {
	mu    sync.Mutex
	m     map[string]cacheEntry
	dirty bool
}

type cacheEntry struct {
	Size   int64  `json:"s"`
	MTime  int64  `json:"m"`
	CTime  int64  `json:"c"`
	Ino    uint64 `json:"i"`
	SHA256 string `json:"h"`
}

// racyWindow: a file modified this recently before it was hashed may change again within the
// filesystem's timestamp granularity without its mtime moving, so its hash is not cached.
const racyWindow = 2 * time.Second

// NewCache returns an empty cache.
func NewCache() *Cache { return &Cache{m: map[string]cacheEntry{}} }

// LoadCache reads a cache file; a missing or unreadable file gives an empty cache (it is only a cache).
func LoadCache(file string) *Cache {
	c := NewCache()
	b, err := os.ReadFile(file)
	if err != nil {
		return c
	}
	var m map[string]cacheEntry
	if json.Unmarshal(b, &m) == nil && m != nil {
		c.m = m
	}
	return c
}

// Save writes the cache temp-then-fsync-then-rename, if it changed.
func (c *Cache) Save(file string) error {
	return c.save(file, true)
}

func (c *Cache) save(file string, fsync bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.dirty {
		return nil
	}
	b, err := encodeCache(c.m)
	if err != nil {
		return err
	}
	write := atomicfile.Write
	if !fsync {
		write = atomicfile.WriteUnsynced
	}
	if err := write(file, b, 0o600); err != nil {
		return fmt.Errorf("save hash cache: %w", err)
	}
	c.dirty = false
	return nil
}

// encodeCache is json.Marshal of the cache's map, without sorting its keys or reflection (a box
// writes the cache of a whole tree right after an initial sync: 11k entries in 3 ms instead of 20).
func encodeCache(m map[string]cacheEntry) ([]byte, error) {
	b := make([]byte, 0, len(m)*128)
	b = append(b, '{')
	first := true
	for p, e := range m {
		if !first {
			b = append(b, ',')
		}
		first = false
		var err error
		if b, err = appendJSONString(b, p); err != nil {
			return nil, err
		}
		b = append(b, `:{"s":`...)
		b = strconv.AppendInt(b, e.Size, 10)
		b = append(b, `,"m":`...)
		b = strconv.AppendInt(b, e.MTime, 10)
		b = append(b, `,"c":`...)
		b = strconv.AppendInt(b, e.CTime, 10)
		b = append(b, `,"i":`...)
		b = strconv.AppendUint(b, e.Ino, 10)
		b = append(b, `,"h":`...)
		if b, err = appendJSONString(b, e.SHA256); err != nil {
			return nil, err
		}
		b = append(b, '}')
	}
	return append(b, '}'), nil
}

// appendJSONString appends s as a JSON string: as it is when it needs no escaping (valid UTF-8
// without quotes, backslashes or control characters), else as encoding/json writes it.
func appendJSONString(b []byte, s string) ([]byte, error) {
	plain := utf8.ValidString(s)
	for i := 0; plain && i < len(s); i++ {
		plain = s[i] >= 0x20 && s[i] != '"' && s[i] != '\\' && s[i] != 0x7f
	}
	if plain {
		b = append(b, '"')
		b = append(b, s...)
		return append(b, '"'), nil
	}
	q, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	return append(b, q...), nil
}

// Len is the number of cached hashes.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}

func (c *Cache) get(p string, fi fs.FileInfo) (string, bool) {
	if c == nil {
		return "", false
	}
	ino, ctime := StatKey(fi)
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[p]
	if !ok || e.Size != fi.Size() || e.MTime != fi.ModTime().UnixNano() || e.CTime != ctime || e.Ino != ino {
		return "", false
	}
	return e.SHA256, true
}

func (c *Cache) put(p string, fi fs.FileInfo, sum string, hashedAt time.Time) {
	if c == nil {
		return
	}
	if !fi.ModTime().Before(hashedAt.Add(-racyWindow)) {
		return
	}
	ino, ctime := StatKey(fi)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m[p] = cacheEntry{Size: fi.Size(), MTime: fi.ModTime().UnixNano(), CTime: ctime, Ino: ino, SHA256: sum}
	c.dirty = true
}

// Record caches sum as the hash of the file at p (relative to the root the cache belongs to)
// described by fi, whose content was checked against sum at checkedAt: an archive reader that
// has just written the file records it, so that the next Build does not re-hash it. The
// racy-timestamp rule applies as for hashes Build computes.
func (c *Cache) Record(p string, fi fs.FileInfo, sum string, checkedAt time.Time) {
	c.put(p, fi, sum, checkedAt)
}

// RecordKey is Record for a writer that has the file's stat from its open descriptor: size,
// mtime and ctime (ns) and inode.
func (c *Cache) RecordKey(p string, size, mtime, ctime int64, ino uint64, sum string, checkedAt time.Time) {
	if c == nil || !time.Unix(0, mtime).Before(checkedAt.Add(-racyWindow)) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m[p] = cacheEntry{Size: size, MTime: mtime, CTime: ctime, Ino: ino, SHA256: sum}
	c.dirty = true
}

// SaveUnsynced is Save without the fsync, for a cache whose loss costs only re-hashing (a
// disposable box's): a torn file reads as an empty cache.
func (c *Cache) SaveUnsynced(file string) error {
	return c.save(file, false)
}

// Keep drops the cached hashes of paths that m does not list.
func (c *Cache) Keep(m *Manifest) {
	if c == nil {
		return
	}
	keep := make(map[string]bool, len(m.Entries))
	for _, e := range m.Entries {
		keep[e.Path] = true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for p := range c.m {
		if !keep[p] {
			delete(c.m, p)
			c.dirty = true
		}
	}
}
