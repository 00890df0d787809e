/* hash.c — SHA-256 (OpenSSL's libcrypto) for content identity, XXH64 for
 * fast checksums. */
#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

#include "strata/base.h"

static void st__hex(const unsigned char* d, size_t n, char* out) {
  static const char kHex[] = "0123456789abcdef";
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kHex[d[i] >> 4];
    out[2 * i + 1] = kHex[d[i] & 15];
  }
  out[2 * n] = '\0';
}

void st_sha256_hex(const void* data, size_t size, char out[65]) {
  unsigned char md[32];
  unsigned int n = 0;
  EVP_Digest(data, size, md, &n, EVP_sha256(), NULL);
  st__hex(md, 32, out);
}

st_status st_sha256_file_hex(const char* path, char out[65]) {
  FILE* f = fopen(path, "rb");
  if (!f) return st_status_make(ST_CODE_IO, "cannot open '%s': %s", path, strerror(errno));
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
  unsigned char buf[1 << 16];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) EVP_DigestUpdate(ctx, buf, n);
  int err = ferror(f);
  fclose(f);
  unsigned char md[32];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx, md, &len);
  EVP_MD_CTX_free(ctx);
  if (err) return st_status_make(ST_CODE_IO, "read error on '%s'", path);
  st__hex(md, 32, out);
  return ST_OK;
}

uint64_t st_hash64(const void* data, size_t size, uint64_t seed) { return XXH64(data, size, seed); }
