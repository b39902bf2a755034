// common/safe_file.h: checksums of files and files that are never left half-written, for the checkpoints
// (train/checkpoint.h) and the log (train/logger.h). Needs nothing of the model.
#pragma once
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <unistd.h>
#include <vector>

// ----------------------------------------------------------------------------
// checksums: a 64-bit hash of every byte of a checkpoint, so that a damaged file (a zeroed page, flipped
// bytes, a short file) is found before training starts from it, instead of showing up steps later as a
// non-finite loss, or never. FNV-1a over 8-byte words in 4 independent lanes (word i goes to lane i % 4:
// the lanes' multiplies overlap, so hashing runs at memory speed, about 10 GB/s, and verifying GPT-2 124M's
// 1.5 GB costs a fraction of the time it takes to read it); each step also folds the high bits down
// (h ^= h >> 29), without which a change in a word's top bit reaches only the top bit of the hash and two
// such changes (two flipped float signs) would cancel. Every step is a bijection of the lane, so a change
// in one word always changes the hash; the byte count is hashed last, so a file cut short never matches.

#define HASH_PRIME 0x100000001b3ULL
struct Hasher {
    uint64_t lane[4];
    uint64_t bytes;       // hashed so far
    unsigned char tail[32];  // bytes waiting for a whole block of 4 words
    int ntail;
};

static void hash_init(Hasher* h) {
    for (int i = 0; i < 4; i++) h->lane[i] = 0xcbf29ce484222325ULL + i;  // FNV's offset basis, one per lane
    h->bytes = 0;
    h->ntail = 0;
}

static inline uint64_t hash_step(uint64_t x, uint64_t w) {
    x = (x ^ w) * HASH_PRIME;
    return x ^ (x >> 29);
}

static inline void hash_block(Hasher* h, const unsigned char* p) {
    uint64_t w[4];
    memcpy(w, p, 32);
    h->lane[0] = hash_step(h->lane[0], w[0]);
    h->lane[1] = hash_step(h->lane[1], w[1]);
    h->lane[2] = hash_step(h->lane[2], w[2]);
    h->lane[3] = hash_step(h->lane[3], w[3]);
}

static void hash_update(Hasher* h, const void* data, size_t n) {
    if (n == 0) return;  // (an empty part may have no memory at all: memcpy from null is undefined even for 0 bytes)
    const unsigned char* p = (const unsigned char*)data;
    h->bytes += n;
    if (h->ntail) {
        size_t k = std::min(n, (size_t)(32 - h->ntail));
        memcpy(h->tail + h->ntail, p, k);
        h->ntail += (int)k;
        p += k;
        n -= k;
        if (h->ntail < 32) return;
        hash_block(h, h->tail);
        h->ntail = 0;
    }
    for (; n >= 32; p += 32, n -= 32) hash_block(h, p);
    memcpy(h->tail, p, n);
    h->ntail = (int)n;
}

static uint64_t hash_final(Hasher* h) {
    if (h->ntail) {  // the last partial block, zero-padded (the byte count tells it from real zeros)
        memset(h->tail + h->ntail, 0, 32 - h->ntail);
        hash_block(h, h->tail);
    }
    uint64_t x = 0xcbf29ce484222325ULL;
    for (int i = 0; i < 4; i++) x = hash_step(x, h->lane[i]);
    x = hash_step(x, h->bytes);
    x ^= x >> 33;  // murmur3's finalizer: every bit of the state reaches every bit of the sum
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

// Hashes bytes [from, to) of an open file, in one pass. Mapped (the pages are hashed where the page cache
// holds them: half the CPU time of read(), which copies every byte first), else read in large blocks.
// Returns false on a read error or a file that ends before `to`.
static bool hash_file(FILE* f, long from, long to, Hasher* h) {
    if (to <= from) return to == from;
    void* map = mmap(nullptr, to, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fileno(f), 0);
    if (map != MAP_FAILED) {
        hash_update(h, (const char*)map + from, to - from);
        munmap(map, to);
        return true;
    }
    static thread_local std::vector<unsigned char> buf(8 << 20);
    if (fseek(f, from, SEEK_SET) != 0) return false;
    for (long done = from; done < to;) {
        size_t want = (size_t)std::min((long)buf.size(), to - done);
        size_t got = fread(buf.data(), 1, want, f);
        hash_update(h, buf.data(), got);
        done += (long)got;
        if (got != want) return false;
    }
    return true;
}

// ----------------------------------------------------------------------------
// files that are never left half-written: the bytes go to PATH.tmp, which is fsynced and renamed over
// PATH only when every write succeeded. A crash at any point leaves the old PATH or the new one.

struct AtomicFile {
    FILE* f;
    std::string path, tmp;
    int err;       // the first failure's errno; 0 while all is well
    Hasher* hash;  // if set, every byte written is hashed too
};

static bool atomic_open(AtomicFile* a, const char* path) {
    a->path = path;
    a->tmp = a->path + ".tmp";
    a->f = fopen(a->tmp.c_str(), "wb");
    a->err = a->f ? 0 : errno;
    a->hash = nullptr;
    return a->f != nullptr;
}

static void atomic_write(AtomicFile* a, const void* p, size_t bytes) {
    if (bytes == 0) return;
    if (a->hash) hash_update(a->hash, p, bytes);
    if (a->err == 0 && fwrite(p, 1, bytes, a->f) != bytes) a->err = errno ? errno : EIO;
}

// Flushes, syncs, closes and renames. On any failure removes the temporary file and returns false
// with a->err set; the caller reports it (once).
static bool atomic_close(AtomicFile* a) {
    errno = 0;
    if (a->err == 0 && fflush(a->f) != 0) a->err = errno ? errno : EIO;
    if (a->err == 0 && fsync(fileno(a->f)) != 0) a->err = errno;
    if (fclose(a->f) != 0 && a->err == 0) a->err = errno;
    if (a->err == 0 && rename(a->tmp.c_str(), a->path.c_str()) != 0) a->err = errno;
    if (a->err != 0) remove(a->tmp.c_str());
    return a->err == 0;
}
